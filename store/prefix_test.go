package store_test

import (
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

// TestPrefixed: a prefixed store is a store (it passes the conformance
// suite), and its buckets live under the prefix.
func TestPrefixed(t *testing.T) {
	ms := memstore.New()
	defer ms.Close()
	storetest.Run(t, func(t *testing.T) store.Store { return store.Prefixed{Store: ms, Prefix: "app1:"} })
	before := ms.Len()
	p := store.Prefixed{Store: ms, Prefix: "app2:"}
	if _, err := storetest.Apply(t.Context(), p, bucket.Take, at1800, drip.Request{Key: "k", Limit: drip.PerSecond(1), Cost: 1}); err != nil {
		t.Fatal(err)
	}
	d, _ := storetest.Apply(t.Context(), ms, bucket.Peek, at1800, drip.Request{Key: "app2:k", Limit: drip.PerSecond(1), Cost: 0})
	if ms.Len() != before+1 || d.Tokens != 0 {
		t.Fatalf("the bucket is not under the prefix: %+v", d)
	}
}

var at1800 = time.Unix(1_800_000_000, 0)
