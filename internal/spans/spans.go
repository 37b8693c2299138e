// Package spans lets the stores and the batcher add to the engine's
// store-call span (engine.SpanStore), which reaches them in the call's
// context: a retry, the batch a call went out in. With tracing off the
// span in the context records nothing and these cost a context lookup.
package spans

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Retry records on ctx's span that a store call is tried again, after
// attempt tries, for reason (a short fixed word, never an error message,
// which may quote a key).
func Retry(ctx context.Context, attempt int, reason string) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.AddEvent("drip.retry", trace.WithAttributes(attribute.Int("drip.attempt", attempt), attribute.String("drip.reason", reason)))
	}
}

// Batch records on the span of each of a batch's n callers (caller(i)
// is the i-th's context) the size of the batch, and returns ctx (the
// batch's call) carrying those spans as one, so that what the store
// records on the call (Retry) reaches every caller's span.
func Batch(ctx context.Context, n int, caller func(i int) context.Context) context.Context {
	var rec []trace.Span
	for i := range n {
		if sp := trace.SpanFromContext(caller(i)); sp.IsRecording() {
			rec = append(rec, sp)
		}
	}
	if len(rec) == 0 {
		return ctx
	}
	size := attribute.Int("drip.batch", n)
	for _, sp := range rec {
		sp.SetAttributes(size)
	}
	return trace.ContextWithSpan(ctx, fanout{Span: rec[0], all: rec})
}

// fanout is several spans as one to what records on it; its identity
// (SpanContext) is the first's.
type fanout struct {
	trace.Span
	all []trace.Span
}

func (f fanout) AddEvent(name string, opts ...trace.EventOption) {
	for _, sp := range f.all {
		sp.AddEvent(name, opts...)
	}
}

func (f fanout) SetAttributes(kv ...attribute.KeyValue) {
	for _, sp := range f.all {
		sp.SetAttributes(kv...)
	}
}

// Leased records on ctx's span how leased tokens (store/leased) decided
// the call: "local" (from the instance's blocks, or a store denial
// repeated: no store call), "block" (a block taken for it) or "store"
// (the store's own decision).
func Leased(ctx context.Context, how string) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.SetAttributes(attribute.String("drip.leased", how))
	}
}
