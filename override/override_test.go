package override_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// TestFollowerMemstore: a follower of the memory store learns of changes
// by notification alone (its poll interval is an hour), and Of finds the
// overrides of a prefixed store under its prefix.
func TestFollowerMemstore(t *testing.T) {
	st := memstore.New(memstore.WithSweep(0))
	ost := store.Prefixed{Store: st, Prefix: "p:"}.Caps().Overrides
	if ost == nil {
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

// TestFollowerIncremental: after its first load, a follower applies the
// changes since its snapshot (Changed names them; untouched overrides are
// the very entries of the snapshot before), and loads every override
// again when the store's record of changes no longer reaches back to its
// snapshot.
func TestFollowerIncremental(t *testing.T) {
	ctx := context.Background()
	st := memstore.New(memstore.WithSweep(0))
	set := func(key string, rate float64) {
		t.Helper()
		if err := override.Set(ctx, st, override.Entry{Rule: "api", Key: key, Limit: drip.Limit{Rate: rate, Burst: rate}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		set(fmt.Sprint("k", i), float64(i+1))
	}
	f := override.NewFollower(st, override.WithoutWatch())
	if err := f.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	s0 := f.Snapshot()
	if keys, all := s0.Changed(); !all || keys != nil || s0.Len() != 100 {
		t.Fatalf("first load: %v %v, %d overrides", keys, all, s0.Len())
	}
	set("k5", 500)
	set("new", 7)
	if _, err := st.DeleteOverride(ctx, "k9"); err != nil {
		t.Fatal(err)
	}
	if err := f.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	s1 := f.Snapshot()
	if keys, all := s1.Changed(); all || !slices.Equal(keys, []string{"k5", "k9", "new"}) {
		t.Fatalf("changed %v %v, want k5, k9, new", keys, all)
	}
	if l, _ := s1.Limit("k5"); l.Rate != 500 {
		t.Fatalf("k5: %+v", l)
	}
	if _, ok := s1.Limit("k9"); ok {
		t.Fatal("k9 deleted, still in the snapshot")
	}
	if l, _ := s1.Limit("new"); l.Rate != 7 || s1.Len() != 100 || len(s1.Entries()) != 100 {
		t.Fatalf("new: %+v; %d overrides", l, s1.Len())
	}
	if l, _ := s0.Limit("k5"); l.Rate != 6 {
		t.Fatalf("the snapshot before changed: k5 %+v", l)
	}
	if _, ok := s0.Limit("k9"); !ok {
		t.Fatal("the snapshot before lost k9")
	}
	for i := range 100 {
		k := fmt.Sprint("k", i)
		a, _ := s0.Entry(k)
		b, _ := s1.Entry(k)
		if k != "k5" && k != "k9" && !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: %+v, then %+v", k, a, b)
		}
	}

	// More changes than the store keeps a record of: a load of them all.
	for i := range 2*store.KeepChanges + 1 {
		set("churn", float64(i+1))
	}
	if err := f.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	s2 := f.Snapshot()
	if _, all := s2.Changed(); !all || s2.Len() != 101 {
		t.Fatalf("after %d changes: all %v, %d overrides", 2*store.KeepChanges+1, all, s2.Len())
	}
	if l, _ := s2.Limit("churn"); l.Rate != 2*store.KeepChanges+1 {
		t.Fatalf("churn: %+v", l)
	}
}

// BenchmarkSnapshotLimit is the lookup every decision makes, in a
// snapshot of 100,000 overrides: a key that has one and a key that has
// none.
func BenchmarkSnapshotLimit(b *testing.B) {
	ctx := context.Background()
	st := memstore.New(memstore.WithSweep(0))
	for i := range 100_000 {
		k := fmt.Sprint("api|k", i)
		if err := override.Set(ctx, st, override.Entry{Rule: "api", Key: k, Limit: drip.Limit{Rate: 5, Burst: 5}}); err != nil {
			b.Fatal(err)
		}
	}
	f := override.NewFollower(st, override.WithoutWatch())
	if err := f.Refresh(ctx); err != nil {
		b.Fatal(err)
	}
	s := f.Snapshot()
	for _, key := range []string{"api|k4242", "api|none"} {
		b.Run(key, func(b *testing.B) {
			for b.Loop() {
				s.Limit(key)
			}
		})
	}
}
