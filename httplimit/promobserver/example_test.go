package promobserver_test

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/httplimit/promobserver"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// The README's middleware snippet: the shipped example rules, the memory
// store, and the middleware's decisions as Prometheus metrics.
func Example() {
	set, err := rules.Load("../../examples/rules.json")
	if err != nil {
		log.Fatal(err) // every problem, one per line
	}
	store := memstore.New()
	defer store.Close()
	metrics := promobserver.New()
	reg := prometheus.NewRegistry() // or prometheus.MustRegister(metrics)
	reg.MustRegister(metrics)
	lim := httplimit.New(store, set, engine.WithLogger(slog.Default()), engine.WithObserver(metrics))
	defer lim.Close()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello\n") })
	handler := lim.Handler(app) // http.ListenAndServe(":8080", handler)

	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("X-Api-Key", "k-123")
	w := httptest.NewRecorder()
	handler.ServeHTTP(w, req)
	fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"))

	m := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(m, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(m.Body.String(), "\n") {
		if strings.HasPrefix(line, "drip_decisions_total{") {
			fmt.Println(line)
		}
	}
	// Output:
	// 200 "free";q=20;w=2, "per-ip";q=20;w=2
	// drip_decisions_total{mode="enforce",outcome="allowed",rule="free"} 1
	// drip_decisions_total{mode="enforce",outcome="allowed",rule="per-ip"} 1
	// drip_decisions_total{mode="shadow",outcome="allowed",rule="all-traffic"} 1
}
