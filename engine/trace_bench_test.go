package engine_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/driplimit/drip/engine"
)

// BenchmarkDecideTracing is BenchmarkDecide with tracing on through the
// OpenTelemetry SDK: a sampler that drops every span (the cost on the
// requests a sampler leaves out), and one that records every span into a
// processor that keeps nothing (the cost of recording, no exporter).
func BenchmarkDecideTracing(b *testing.B) {
	for _, bc := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{{"dropped", sdktrace.NeverSample()}, {"sampled", sdktrace.AlwaysSample()}} {
		b.Run(bc.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(bc.sampler), sdktrace.WithSpanProcessor(discard{}))
			defer tp.Shutdown(context.Background())
			benchDecide(b, engine.WithTracerProvider(tp))
		})
	}
}

// discard is a span processor that keeps nothing.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }
