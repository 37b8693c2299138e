package leased_test

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
)

// TestSpanSaysHow: the store call's span says how leased tokens decided
// it: the first take by the store, later ones, once demand calls for a
// block, from the instance's block.
func TestSpanSaysHow(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	ls, err := leased.New(ms, leased.LeaseInProcess())
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	p, err := drip.PerSecond(1000).WithBurst(1000).Params("k")
	if err != nil {
		t.Fatal(err)
	}
	var it bucket.Prepared
	if err := store.Prepare(&it, bucket.Take, "k", &p, 1, false, ""); err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1_800_000_000, 0)
	res := make([]bucket.Result, 1)
	for i := range 50 {
		ctx, sp := tp.Tracer("test").Start(context.Background(), "drip.store")
		if err := ls.Apply(ctx, bucket.Take, at.Add(time.Duration(i)*time.Millisecond), []bucket.Prepared{it}, res); err != nil {
			t.Fatal(err)
		}
		sp.End()
	}
	how := map[string]int{}
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == "drip.leased" {
				how[kv.Value.AsString()]++
			}
		}
	}
	if how["store"] == 0 || how["local"] == 0 || how["store"]+how["local"]+how["block"] != 50 {
		t.Errorf("drip.leased on 50 store spans: %v; want the first by the store, most local", how)
	}
}
