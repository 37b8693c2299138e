package httplimit_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/internal/cputime"
	"github.com/driplimit/drip/internal/testkit/spantest"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// BenchmarkHandler measures the middleware's own cost per request on the
// memory store (no network): the built-in default rules (one enforce rule
// per IP, one shadow rule), over 1000 client IPs. Besides ns/op it
// reports cpu-ns/op (internal/cputime: run it with -cpu 1).
func BenchmarkHandler(b *testing.B) { benchHandler(b) }

// BenchmarkHandlerTracing is BenchmarkHandler with tracing on, through
// the OpenTelemetry SDK: a sampler that drops every span (what tracing
// costs on requests it does not record), and one that records every span
// into a processor that keeps nothing (the cost of recording, without an
// exporter). BenchmarkHandler is the cost with tracing off.
func BenchmarkHandlerTracing(b *testing.B) {
	for _, bc := range spantest.Samplers {
		b.Run(bc.Name, func(b *testing.B) {
			tp := spantest.Provider(bc.Sampler)
			defer tp.Shutdown(context.Background())
			benchHandler(b, engine.WithTracerProvider(tp))
		})
	}
}

func benchHandler(b *testing.B, opts ...httplimit.Option) {
	ms := memstore.New()
	defer ms.Close()
	l := httplimit.New(ms, rules.Default(), append([]httplimit.Option{engine.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	defer l.Close()
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	reqs := make([]*http.Request, 1000)
	for i := range reqs {
		reqs[i] = httptest.NewRequest("GET", "/api/x", nil)
		reqs[i].RemoteAddr = "10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250) + ":1234"
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := cputime.Process()
	for i := range b.N {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, reqs[i%len(reqs)])
	}
	cputime.Report(b, start)
}

// BenchmarkKeyHandler is BenchmarkHandler for a key limiter (one limit,
// no shadow rule), over 1000 keys.
func BenchmarkKeyHandler(b *testing.B) {
	ms := memstore.New()
	defer ms.Close()
	l, err := httplimit.NewKeyLimiter(ms, httplimit.KeyLimit{Limit: drip.PerSecond(10).WithBurst(20),
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }},
		engine.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	reqs := make([]*http.Request, 1000)
	for i := range reqs {
		reqs[i] = httptest.NewRequest("GET", "/api/x", nil)
		reqs[i].Header.Set("X-User", "user-"+strconv.Itoa(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := cputime.Process()
	for i := range b.N {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, reqs[i%len(reqs)])
	}
	cputime.Report(b, start)
}
