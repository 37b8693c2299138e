package engine

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// TracerName is the instrumentation scope of the engine's spans.
const TracerName = "github.com/driplimit/drip/engine"

// Span names and attribute keys of the engine's traces.
const (
	// SpanDecide is the span of one Decide: its attributes are the rules
	// that applied (drip.rules) and what happened to each (drip.events,
	// in the same order: an Event), the outcome (drip.allowed, drip.status,
	// drip.reason, drip.denied_by), whether the store failed
	// (drip.store_failed), the store's kind (drip.store) and the leased
	// rules among those that applied (drip.leased_rules, when any: how
	// each store call was decided is its span's drip.leased).
	SpanDecide = "drip.decide"
	// SpanStore is the span of one store call (Apply, and those of
	// Decide and DecideItems): drip.op, drip.keys (how many buckets), drip.store, the
	// error if it failed, and drip.breaker "open" when the circuit
	// breaker skipped it. Stores add events to it: a retry (drip.retry),
	// the batch a call went out in (drip.batch).
	SpanStore = "drip.store"
)

// Bucket keys name clients (addresses, user ids): they are never put in
// a span, and neither are the messages of input errors, which may quote
// them.

// WithTracerProvider makes the engine trace its work with tp (nil: no
// tracing, the default): a span per Decide (SpanDecide) and a child span
// per store call (SpanStore). Front doors that pass the request's context
// make these spans children of theirs. Only the OpenTelemetry API is
// used here; the program chooses the SDK and exporter. Without this
// option tracing costs one nil check per call.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(e *Engine) {
		if tp == nil {
			e.tracer = nil
			return
		}
		e.tracer = tp.Tracer(TracerName)
		e.kind = attribute.String("drip.store", storeName(e.store))
	}
}

// storeName is the store's kind for spans (Caps.Name): "custom" when it
// names none.
func storeName(s store.Store) string {
	if n := s.Caps().Name; n != "" {
		return n
	}
	return "custom"
}

// startDecide starts a Decide's span, if the engine traces.
func (e *Engine) startDecide(ctx context.Context) (context.Context, trace.Span) {
	if e.tracer == nil {
		return ctx, nil
	}
	return e.tracer.Start(ctx, SpanDecide)
}

// endDecide records out on sp and ends it.
func (e *Engine) endDecide(sp trace.Span, out *Outcome) {
	if sp == nil {
		return
	}
	if sp.IsRecording() {
		names := make([]string, len(out.Applied))
		events := make([]string, len(out.Applied))
		for i := range out.Applied {
			names[i], events[i] = out.Applied[i].Rule.Name, string(out.Applied[i].Event)
		}
		attrs := []attribute.KeyValue{e.kind,
			attribute.StringSlice("drip.rules", names),
			attribute.StringSlice("drip.events", events),
			attribute.Bool("drip.allowed", out.Allowed),
			attribute.Int("drip.status", spanStatus(out)),
		}
		if !out.Allowed {
			attrs = append(attrs, attribute.String("drip.reason", out.Reason))
			if out.Top != nil {
				attrs = append(attrs, attribute.String("drip.denied_by", out.Top.Rule.Name))
			}
		}
		if out.Err != nil {
			attrs = append(attrs, attribute.Bool("drip.store_failed", true))
		}
		var leased []string
		for i := range out.Applied {
			if out.Applied[i].Limit.Leased {
				leased = append(leased, out.Applied[i].Rule.Name)
			}
		}
		if leased != nil {
			attrs = append(attrs, attribute.StringSlice("drip.leased_rules", leased))
		}
		sp.SetAttributes(attrs...)
	}
	sp.End()
}

// spanStatus is a decision's drip.status attribute: the status an HTTP
// door answers it with, 0 (allowed), 429 (over a limit) or 503 (the store
// failed and on_error denied), for those who read the span beside the
// access log.
func spanStatus(out *Outcome) int {
	switch {
	case out.Allowed:
		return 0
	case out.Reason == ReasonStoreUnavailable:
		return 503
	}
	return 429
}

// startStore starts a store call's span, if the engine traces.
func (e *Engine) startStore(ctx context.Context, op bucket.Op, keys int) (context.Context, trace.Span) {
	if e.tracer == nil {
		return ctx, nil
	}
	ctx, sp := e.tracer.Start(ctx, SpanStore)
	if sp.IsRecording() {
		sp.SetAttributes(e.kind, attribute.String("drip.op", op.String()), attribute.Int("drip.keys", keys))
	}
	return ctx, sp
}

// endStore records err on sp and ends it.
// refused records a store call that its input refused before the store
// was asked (store.IsInput), as a store span marked bad input.
func (e *Engine) refused(ctx context.Context, op bucket.Op, keys int, err error) {
	if e.tracer != nil && store.IsInput(err) {
		_, sp := e.startStore(ctx, op, keys)
		endStore(sp, err)
	}
}

func endStore(sp trace.Span, err error) {
	if sp == nil {
		return
	}
	if err != nil && sp.IsRecording() {
		switch {
		case errors.Is(err, ErrBreakerOpen):
			sp.SetAttributes(attribute.String("drip.breaker", BreakerOpen))
			sp.SetStatus(codes.Error, err.Error())
		case store.IsInput(err):
			sp.SetStatus(codes.Error, "bad input")
		default:
			sp.RecordError(err)
			sp.SetStatus(codes.Error, err.Error())
		}
	}
	sp.End()
}
