package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/store/memstore"
)

// deadlines records whether each store call's context had a deadline.
type deadlines struct {
	drip.Store
	had []bool
}

func (d *deadlines) Apply(ctx context.Context, op drip.Op, at time.Time, r drip.Request) (drip.Decision, error) {
	_, ok := ctx.Deadline()
	d.had = append(d.had, ok)
	return d.Store.Apply(ctx, op, at, r)
}

// inProcess is deadlines on a store that says it is a drip.InProcess.
type inProcess struct{ *deadlines }

func (inProcess) InProcess() {}

// TestInProcessNoDeadline: the engine gives a store call its deadline,
// except on a drip.InProcess store (the memory store), which never waits on
// a server: a timer per call would buy nothing there.
func TestInProcessNoDeadline(t *testing.T) {
	if _, ok := drip.Store(memstore.New()).(drip.InProcess); !ok {
		t.Fatal("the memory store is not a drip.InProcess")
	}
	req := []drip.Request{{Key: "k", Limit: drip.PerSecond(10), Cost: 1}}
	for _, c := range []struct {
		name  string
		store func(*deadlines) drip.Store
		want  bool
	}{
		{"a store", func(d *deadlines) drip.Store { return d }, true},
		{"an in-process store", func(d *deadlines) drip.Store { return inProcess{d} }, false},
	} {
		ms := memstore.New()
		d := &deadlines{Store: ms}
		e := engine.New(c.store(d))
		if _, err := e.Apply(context.Background(), drip.OpTake, req); err != nil {
			t.Fatal(err)
		}
		if len(d.had) != 1 || d.had[0] != c.want {
			t.Errorf("%s: deadlines %v, want [%v]", c.name, d.had, c.want)
		}
		e.Close()
		ms.Close()
	}
}
