package engine_test

import (
	"context"
	"testing"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/testkit/spantest"
)

// BenchmarkDecideTracing is BenchmarkDecide with tracing on through the
// OpenTelemetry SDK: a sampler that drops every span (the cost on the
// requests a sampler leaves out), and one that records every span into a
// processor that keeps nothing (the cost of recording, no exporter).
func BenchmarkDecideTracing(b *testing.B) {
	for _, bc := range spantest.Samplers {
		b.Run(bc.Name, func(b *testing.B) {
			tp := spantest.Provider(bc.Sampler)
			defer tp.Shutdown(context.Background())
			benchDecide(b, engine.WithTracerProvider(tp))
		})
	}
}
