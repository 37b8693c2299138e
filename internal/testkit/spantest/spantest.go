// Package spantest holds what the tests and benchmarks of drip's tracing
// share: span processors that keep nothing or hand spans over, and the
// samplers the benchmarks compare. Only tests import it (it imports the
// OpenTelemetry SDK, which drip's packages leave to the program).
package spantest

import (
	"context"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Discard is a span processor that keeps nothing: the cost of recording
// spans without an exporter.
type Discard struct{}

func (Discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (Discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (Discard) Shutdown(context.Context) error                  { return nil }
func (Discard) ForceFlush(context.Context) error                { return nil }

// Samplers are the benchmarks' cases of tracing on: a sampler that drops
// every span (what tracing costs on the requests it leaves out) and one
// that records every span.
var Samplers = []struct {
	Name    string
	Sampler sdktrace.Sampler
}{{"dropped", sdktrace.NeverSample()}, {"sampled", sdktrace.AlwaysSample()}}

// Provider is a tracer provider with sampler whose spans go to Discard.
func Provider(sampler sdktrace.Sampler) *sdktrace.TracerProvider {
	return sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSpanProcessor(Discard{}))
}
