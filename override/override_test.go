package override_test

import (
	"context"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/store/memstore"
)

// TestFollowerMemstore: a follower of the memory store learns of changes
// by notification alone (its poll interval is an hour), and Of finds the
// overrides of a prefixed store under its prefix.
func TestFollowerMemstore(t *testing.T) {
	st := memstore.New(memstore.WithSweep(0))
	ost, ok := override.Of(drip.Prefixed{Store: st, Prefix: "p:"})
	if !ok {
		t.Fatal("a prefixed memory store keeps no overrides")
	}
	snaps := make(chan *override.Snapshot, 16)
	f := override.NewFollower(ost, override.WithPoll(time.Hour), override.OnChange(func(s *override.Snapshot) { snaps <- s }))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	next := func() *override.Snapshot {
		t.Helper()
		select {
		case s := <-snaps:
			return s
		case <-time.After(30 * time.Second):
			t.Fatal("no snapshot")
			return nil
		}
	}
	if s := next(); len(s.Entries()) != 0 {
		t.Fatalf("first snapshot: %+v", s.Entries())
	}
	l := drip.Limit{Rate: 5, Burst: 7}
	if err := override.Set(ctx, ost, override.Entry{Rule: "api", Values: []string{"acme"}, Key: "api|acme", Limit: l}); err != nil {
		t.Fatal(err)
	}
	s := next()
	if got, ok := s.Limit("api|acme"); !ok || got != l {
		t.Fatalf("after Set: %+v %v", got, ok)
	}
	if _, all, _ := st.Overrides(ctx); len(all) != 1 || all["p:api|acme"] == nil {
		t.Fatalf("stored under %v, want the prefix", all)
	}
	if err := override.Set(ctx, ost, override.Entry{Key: "bad", Limit: drip.Limit{Rate: -1}}); err == nil {
		t.Fatal("an invalid limit was stored")
	}
	if ok, err := ost.DeleteOverride(ctx, "api|acme"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if s := next(); len(s.Entries()) != 0 || f.Snapshot() != s {
		t.Fatalf("after Delete: %+v", s.Entries())
	}
	var none *override.Snapshot
	if _, ok := none.Limit("x"); ok || none.Version() != 0 {
		t.Fatal("the nil snapshot holds an override")
	}
}
