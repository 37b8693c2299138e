package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// hang is a store whose calls wait until their caller leaves.
type hang struct{ called chan struct{} }

func (h hang) Apply(ctx context.Context, _ bucket.Op, _ time.Time, _ []bucket.Prepared, _ []bucket.Result) error {
	h.called <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

func (hang) Caps() store.Caps { return store.Caps{} }

func (hang) Reset(context.Context, string) error { return nil }

// TestCallerLeftDenied: a caller that leaves while the store is asked
// gets a denial, not on_error's allow: on_error is for a store that
// fails, and this store did not.
func TestCallerLeftDenied(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
	  {"name": "per-key", "limit_keys": ["header:x-api-key"], "on_error": "allow", "algorithm_config": {"rate": 1, "period": "1m"}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	h := hang{called: make(chan struct{}, 1)}
	e := engine.New(h, engine.WithoutDenials(), engine.WithTimeout(time.Hour))
	defer e.Close()
	rs := e.Compile(set)
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-h.called
		cancel()
	}()
	out := e.Decide(ctx, rs, values{"header:x-api-key": "client-7"})
	if out.Allowed {
		t.Fatalf("a caller that left was allowed (on_error allow stood in): %+v", out)
	}
	if out.Err == nil {
		t.Error("no error on the outcome of a call cut short")
	}
	if ev := out.Applied[0].Event; ev != engine.NotTaken {
		t.Errorf("event %v, want %v", ev, engine.NotTaken)
	}
}
