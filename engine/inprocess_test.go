package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// deadlines records whether each store call's context had a deadline,
// and the context; its Caps say InProcess when inproc is set.
type deadlines struct {
	store.Store
	inproc bool
	had    []bool
	got    []context.Context
}

func (d *deadlines) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	_, ok := ctx.Deadline()
	d.had, d.got = append(d.had, ok), append(d.got, ctx)
	return d.Store.Apply(ctx, op, at, items, results)
}

func (d *deadlines) Caps() store.Caps {
	c := d.Store.Caps()
	c.InProcess = d.inproc
	return c
}

// TestInProcessNoDeadline: the engine gives a store call its deadline,
// except on a store whose Caps say InProcess (the memory store), which
// never waits on a server: a timer per call would buy nothing there.
func TestInProcessNoDeadline(t *testing.T) {
	if !memstore.New().Caps().InProcess {
		t.Fatal("the memory store's Caps do not say InProcess")
	}
	req := []drip.Request{{Key: "k", Limit: drip.PerSecond(10), Cost: 1}}
	for _, c := range []struct {
		name   string
		inproc bool
		want   bool
	}{
		{"a store", false, true},
		{"an in-process store", true, false},
	} {
		ms := memstore.New()
		d := &deadlines{Store: ms, inproc: c.inproc}
		e := engine.New(d)
		if _, err := e.Apply(context.Background(), bucket.Take, req, nil); err != nil {
			t.Fatal(err)
		}
		if len(d.had) != 1 || d.had[0] != c.want {
			t.Errorf("%s: deadlines %v, want [%v]", c.name, d.had, c.want)
		}
		e.Close()
		ms.Close()
	}
}

// TestCallerDeadlineWithinTimeout: a caller whose deadline comes before
// the engine's store timeout (Envoy's 20 ms against a second) has its
// store call made under its own context, which bounds it already, and
// no context or timer is made for it; a caller with a later deadline,
// or none, gets one that ends at the timeout.
func TestCallerDeadlineWithinTimeout(t *testing.T) {
	req := []drip.Request{{Key: "k", Limit: drip.PerSecond(10), Cost: 1}}
	for _, c := range []struct {
		name string
		in   time.Duration // the caller's deadline from now (0: none)
		own  bool          // the store call gets the caller's context
	}{
		{"a deadline within the timeout", time.Minute, true},
		{"a deadline after the timeout", time.Hour, false},
		{"no deadline", 0, false},
	} {
		ms := memstore.New()
		rec := &deadlines{Store: ms}
		e := engine.New(rec, engine.WithTimeout(10*time.Minute))
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if c.in > 0 {
			ctx, cancel = context.WithTimeout(ctx, c.in)
		}
		if _, err := e.Apply(ctx, bucket.Take, req, nil); err != nil {
			t.Fatal(err)
		}
		if len(rec.got) != 1 {
			t.Fatalf("%s: %d store calls", c.name, len(rec.got))
		}
		got := rec.got[0]
		dl, ok := got.Deadline()
		if own := got == ctx; own != c.own || !ok {
			t.Errorf("%s: the store call had the caller's context: %v (want %v); a deadline: %v", c.name, own, c.own, ok)
		}
		if want, _ := ctx.Deadline(); c.own && !dl.Equal(want) {
			t.Errorf("%s: the store call's deadline %v, want the caller's %v", c.name, dl, want)
		}
		cancel()
		e.Close()
		ms.Close()
	}
}
