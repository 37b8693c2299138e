package promobserver_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/httplimit/promobserver"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// TestCounts drives the middleware through three requests of one client
// on an enforce rule of burst 2 beside a shadow rule of burst 1, and reads
// the series.
func TestCounts(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
		{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 2}},
		{"name": "watch", "limit_keys": ["global"], "mode": "shadow", "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New()
	defer store.Close()
	obs := promobserver.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	lim := httplimit.New(store, set, httplimit.WithObserver(obs))
	defer lim.Close()
	h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var codes []int
	for range 3 {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Api-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codes = append(codes, w.Code)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("statuses %v, want 200 200 429", codes)
	}
	// The shadow rule is taken only when the request is allowed (twice):
	// it allows the first and would deny the second; on the denied third
	// it is peeked, and would deny again.
	w := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	got := w.Body.String()
	for _, want := range []string{
		`drip_decisions_total{outcome="allowed",rule="per-key"} 2` + "\n",
		`drip_decisions_total{outcome="denied",rule="per-key"} 1` + "\n",
		`drip_decisions_total{outcome="allowed",rule="watch"} 1` + "\n",
		`drip_decisions_total{outcome="denied",rule="watch"} 2` + "\n",
		`drip_shadow_denials_total{rule="watch"} 2` + "\n",
		`drip_store_circuit_state{state="closed"} 1` + "\n",
		`drip_store_circuit_state{state="open"} 0` + "\n",
		"drip_store_errors_total 0\n",
		"drip_store_duration_seconds_count ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("metrics lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "drip_local_fallback_decisions_total{") {
		t.Errorf("a fallback counted with the store up:\n%s", got)
	}
}
