package httplimit_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// BenchmarkHandler measures the middleware's own cost per request on the
// memory store (no network): the built-in default rules (one enforce rule
// per IP, one shadow rule), over 1000 client IPs.
func BenchmarkHandler(b *testing.B) {
	ms := memstore.New()
	defer ms.Close()
	l := httplimit.New(ms, rules.Default(), httplimit.WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	reqs := make([]*http.Request, 1000)
	for i := range reqs {
		reqs[i] = httptest.NewRequest("GET", "/api/x", nil)
		reqs[i].RemoteAddr = "10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250) + ":1234"
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, reqs[i%len(reqs)])
	}
}

// BenchmarkHandlerTracing is BenchmarkHandler with tracing on, through
// the OpenTelemetry SDK: a sampler that drops every span (what tracing
// costs on requests it does not record), and one that records every span
// into a processor that keeps nothing (the cost of recording, without an
// exporter). BenchmarkHandler is the cost with tracing off.
func BenchmarkHandlerTracing(b *testing.B) {
	for _, bc := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{{"dropped", sdktrace.NeverSample()}, {"sampled", sdktrace.AlwaysSample()}} {
		b.Run(bc.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(bc.sampler), sdktrace.WithSpanProcessor(discard{}))
			defer tp.Shutdown(context.Background())
			ms := memstore.New()
			defer ms.Close()
			l := httplimit.New(ms, rules.Default(), httplimit.WithLogger(slog.New(slog.DiscardHandler)), httplimit.WithTracerProvider(tp))
			defer l.Close()
			h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
			reqs := make([]*http.Request, 1000)
			for i := range reqs {
				reqs[i] = httptest.NewRequest("GET", "/api/x", nil)
				reqs[i].RemoteAddr = "10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250) + ":1234"
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, reqs[i%len(reqs)])
			}
		})
	}
}

// discard is a span processor that keeps nothing.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }
