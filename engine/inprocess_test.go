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

// deadlines records whether each store call's context had a deadline;
// its Caps say InProcess when inproc is set.
type deadlines struct {
	store.Store
	inproc bool
	had    []bool
}

func (d *deadlines) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	_, ok := ctx.Deadline()
	d.had = append(d.had, ok)
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
