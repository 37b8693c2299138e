package store_test

import (
	"errors"
	"strings"
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

// TestWrappersCountTheirKeys: store.MaxKeyLen counts the key as the store
// is given it, a wrapper's prefix or shard suffix included, so a key
// valid as the caller wrote it is refused once a wrapper lengthens it
// past the bound.
func TestWrappersCountTheirKeys(t *testing.T) {
	ms := memstore.New()
	defer ms.Close()
	key := strings.Repeat("k", store.MaxKeyLen-1)
	for _, st := range []store.Store{
		store.Prefixed{Store: ms, Prefix: "p:"},
		store.Sharded{Store: ms, N: 1},
		store.Sharded{Store: ms, N: 4},
	} {
		_, err := drip.Apply(t.Context(), st, bucket.Take, at1800, drip.Request{Key: key, Limit: drip.PerSecond(1), Cost: 1})
		if !errors.Is(err, store.ErrKeyTooLong) {
			t.Errorf("%T: a key of %d bytes, lengthened: %v, want ErrKeyTooLong", st, len(key), err)
		}
	}
	if _, err := drip.Apply(t.Context(), ms, bucket.Take, at1800, drip.Request{Key: key, Limit: drip.PerSecond(1), Cost: 1}); err != nil {
		t.Errorf("the same key on the store itself: %v", err)
	}
}
