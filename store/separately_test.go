package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

// oneKeyStore refuses multi-takes of several keys, as Redis Cluster does
// across hash slots.
type oneKeyStore struct{ *memstore.Store }

func (s oneKeyStore) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if len(items) > 1 {
		return fmt.Errorf("cross slot: %w", store.ErrNotColocated)
	}
	return s.Store.Apply(ctx, op, at, items, results)
}

func TestSeparately(t *testing.T) {
	ms := memstore.New()
	defer ms.Close()
	s := store.Separately{Store: oneKeyStore{ms}}
	ctx := context.Background()
	at := time.Unix(1_800_000_000, 0)
	a := drip.Request{Key: "a", Limit: drip.PerHour(1).WithBurst(10), Cost: 1}
	b := drip.Request{Key: "b", Limit: drip.PerHour(1).WithBurst(2), Cost: 1}
	c := drip.Request{Key: "c", Limit: drip.PerHour(1).WithBurst(5), Cost: 1}
	for range 2 {
		if m, err := drip.Apply(ctx, s, bucket.Take, at, []drip.Request{a, b, c}...); err != nil || !m.Allowed {
			t.Fatalf("%+v %v", m, err)
		}
	}
	m, err := drip.Apply(ctx, s, bucket.Take, at, []drip.Request{a, b, c}...)
	if err != nil || m.Allowed {
		t.Fatalf("b is empty: %+v %v", m, err)
	}
	if !m.Decisions[0].Allowed || m.Decisions[0].Tokens != 7 || m.Decisions[1].Allowed || !m.Decisions[2].Allowed || m.Decisions[2].Tokens != 2 {
		t.Fatalf("each request's own decision: %+v", m.Decisions)
	}
	for _, r := range []drip.Request{a, c} {
		d, _ := storetest.Apply(ctx, ms, bucket.Peek, at, drip.Request{Key: r.Key, Limit: r.Limit})
		if d.Tokens != r.Limit.Burst-2 {
			t.Errorf("%s holds %v after the denied multi-take, want %v: nothing may stay taken", r.Key, d.Tokens, r.Limit.Burst-2)
		}
	}
	if _, err := drip.Apply(ctx, s, bucket.Take, at, []drip.Request{a, a}...); err == nil {
		t.Error("duplicate keys must still be an error")
	}
}
