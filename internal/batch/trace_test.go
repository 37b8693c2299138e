package batch

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/driplimit/drip/internal/spans"
)

// A traced caller's span gets the size of the batch its request went out
// in, and what the store records on the batch's call (a retry) reaches
// every traced caller of the batch; untraced callers are left alone.
func TestBatchSpans(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
		defer tp.Shutdown(context.Background())
		gate := make(chan struct{})
		first := true
		b := New(Options{MaxBatch: 8, InFlight: 1}, nil, func(ctx context.Context, calls []*Call[int, int]) {
			if first { // request 0 holds the worker while the others queue
				first = false
				<-gate
				return
			}
			spans.Retry(ctx, 1, "conflict")
			for _, c := range calls {
				c.Res = c.Req
			}
		}, nil)
		defer b.Close()
		var wg sync.WaitGroup
		do := func(req int, traced bool) {
			defer wg.Done()
			ctx := context.Background()
			if traced {
				var sp trace.Span
				ctx, sp = tp.Tracer("test").Start(ctx, "caller")
				sp.SetAttributes(attribute.Int("req", req))
				defer sp.End()
			}
			b.Do(ctx, req)
		}
		wg.Add(4)
		go do(0, false)
		synctest.Wait()
		go do(1, true)
		go do(2, true)
		go do(3, false)
		synctest.Wait()
		close(gate)
		wg.Wait()
		got := rec.Ended()
		if len(got) != 2 {
			t.Fatalf("%d spans, want the 2 traced callers'", len(got))
		}
		for _, s := range got {
			var size int64
			for _, kv := range s.Attributes() {
				if kv.Key == "drip.batch" {
					size = kv.Value.AsInt64()
				}
			}
			var retries int
			for _, ev := range s.Events() {
				if ev.Name == "drip.retry" {
					retries++
				}
			}
			if size != 3 || retries != 1 {
				t.Errorf("span %v: batch %d, %d retry events; want 3 and 1", s.Attributes(), size, retries)
			}
		}
	})
}
