package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestExtremesPast holds the memory store, without a sweeper, to the
// exact model from before 1970 (storetest.RunExtremesPast).
func TestExtremesPast(t *testing.T) {
	storetest.RunExtremesPast(t, func(t *testing.T) store.Store {
		s := memstore.New(memstore.WithSweep(0))
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestBoundedMemory sends many more distinct keys than the bound allows,
// as an attacker would: the store stays within its bound, and a bucket
// that is far from full survives the flood, which evicts the buckets
// nearest to full first.
func TestBoundedMemory(t *testing.T) {
	const bound = 4096
	s := memstore.New(memstore.WithMaxKeys(bound), memstore.WithSweep(0))
	defer s.Close()
	ctx := context.Background()
	at := time.Unix(1_000_000, 0)
	lim := drip.PerMinute(10)
	// A real user who has spent their whole burst.
	if d, _ := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: "victim", Limit: lim, Cost: 10}); !d.Allowed {
		t.Fatal(d)
	}
	// 200,000 one-off keys, each one token off full.
	for i := range 200_000 {
		if _, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: fmt.Sprint("attacker-", i), Limit: lim, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Len(); n > bound+256 {
		t.Fatalf("%d buckets held, bound %d", n, bound)
	}
	d, _ := storetest.Apply(ctx, s, bucket.Peek, at, drip.Request{Key: "victim", Limit: lim, Cost: 1})
	if d.Allowed || d.Tokens != 0 {
		t.Fatalf("the empty bucket was evicted before nearly full ones: %+v", d)
	}
}

func TestSweep(t *testing.T) {
	s := memstore.New(memstore.WithSweep(0))
	defer s.Close()
	ctx := context.Background()
	at := time.Unix(1_000_000, 0)
	storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: "short", Limit: drip.PerSecond(1), Cost: 1})
	storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: "long", Limit: drip.PerHour(1), Cost: 1})
	if n := s.Sweep(at.Add(memstore.SweepMargin)); n != 0 {
		t.Fatalf("swept %d buckets before any expired a margin ago", n)
	}
	if n := s.Sweep(at.Add(time.Second + memstore.SweepMargin)); n != 1 || s.Len() != 1 {
		t.Fatalf("swept %d, %d left; want the refilled bucket gone and the other kept", n, s.Len())
	}
}

// TestBoundedBytes floods the store with long keys, as a hostile client
// sending 1 MB keys would: what the store counts stays within its bound
// on bytes, and so does the heap it keeps (after GC, within a generous
// factor for the index and the Go runtime's own slack), while a key of
// any length still gets its own bucket.
func TestBoundedBytes(t *testing.T) {
	const bound = 4 << 20
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := memstore.New(memstore.WithMaxBytes(bound), memstore.WithSweep(0))
	defer s.Close()
	ctx := context.Background()
	at := time.Unix(1_000_000, 0)
	lim := drip.PerHour(10)
	take := func(key string) drip.Decision {
		d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// A 1 MiB key is refused before it reaches the store (store.MaxKeyLen),
	// and takes nothing.
	big := make([]byte, 1<<20)
	for i := range 30 {
		copy(big, fmt.Sprintf("big-%d-", i))
		if _, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: string(big), Limit: lim, Cost: 1}); !errors.Is(err, store.ErrKeyTooLong) {
			t.Fatalf("1 MiB key %d: err = %v, want %v", i, err, store.ErrKeyTooLong)
		}
	}
	if n := s.Bytes(); n != 0 {
		t.Fatalf("refused keys left %d bytes counted", n)
	}
	// The longest keys a store is given (held hashed) and keys just short
	// of being hashed: 20 MB of keys in all, five times the bound.
	for i := range 10_000 {
		take(fmt.Sprintf("%0*d", store.MaxKeyLen, i))
		if n := s.Bytes(); n > bound {
			t.Fatalf("after %d keys of %d bytes, the store counts %d bytes, bound %d", i+1, store.MaxKeyLen, n, bound)
		}
	}
	for i := range 20_000 {
		take(fmt.Sprintf("%0*d", memstore.MaxKeyLen, i))
		if n := s.Bytes(); n > bound {
			t.Fatalf("after %d keys of %d bytes, the store counts %d bytes, bound %d", i+1, memstore.MaxKeyLen, n, bound)
		}
	}
	if n := s.Len(); n < bound/2/(memstore.BucketBytes+memstore.MaxKeyLen) {
		t.Fatalf("only %d buckets held; the bound allows about %d", n, bound/(memstore.BucketBytes+memstore.MaxKeyLen))
	}
	// The same long (hashed) key again is the same bucket, not a fresh one.
	long := "again-" + strings.Repeat("x", store.MaxKeyLen-6)
	take(long)
	if d := take(long); d.Tokens != 8 {
		t.Fatalf("a %d-byte key taken twice: %+v, want 8 tokens left", len(long), d)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if grew > 3*bound {
		t.Fatalf("the heap grew by %d bytes over a flood of long keys, bound %d", grew, bound)
	}
	t.Logf("bound %d bytes: the store counts %d in %d buckets; the heap grew by %d", bound, s.Bytes(), s.Len(), grew)
	runtime.KeepAlive(s)
}

// TestTable checks the shards' hash tables against a map, through many
// takes and resets (each reset removes a slot and shifts the run after it
// back): every key's bucket must stay its own.
func TestTable(t *testing.T) {
	s := memstore.New(memstore.WithSweep(0))
	defer s.Close()
	ctx := context.Background()
	at := time.Unix(1_000_000, 0)
	lim := drip.PerHour(1000)
	taken := map[string]int{}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		k := fmt.Sprint("k", rng.IntN(5000))
		if rng.IntN(3) == 0 {
			if err := s.Reset(ctx, k); err != nil {
				t.Fatal(err)
			}
			delete(taken, k)
			continue
		}
		d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: k, Limit: lim, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		taken[k]++
		if want := float64(1000 - taken[k]); d.Tokens != want {
			t.Fatalf("key %s: %v tokens, want %v", k, d.Tokens, want)
		}
	}
	if s.Len() != len(taken) {
		t.Fatalf("%d buckets held, want %d", s.Len(), len(taken))
	}
}

// TestSweepLeases: a lease set whose leases all expired is swept a margin
// later; a live one stays.
func TestSweepLeases(t *testing.T) {
	s := memstore.New(memstore.WithSweep(0))
	t0 := time.Unix(1_800_000_000, 0)
	lim := drip.InFlight(2, time.Minute)
	for _, k := range []string{"a", "b"} {
		if _, err := storetest.Apply(context.Background(), s, bucket.Take, t0, drip.Request{Key: k, Limit: lim, Lease: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := storetest.Apply(context.Background(), s, bucket.Take, t0.Add(time.Hour), drip.Request{Key: "b", Limit: lim, Lease: "y"}); err != nil {
		t.Fatal(err)
	}
	if n := s.Len(); n != 2 {
		t.Fatalf("Len %d, want 2", n)
	}
	if n := s.Sweep(t0.Add(time.Minute + memstore.SweepMargin - time.Nanosecond)); n != 0 {
		t.Fatalf("swept %d before the margin passed", n)
	}
	if n := s.Sweep(t0.Add(time.Minute + memstore.SweepMargin)); n != 1 || s.Len() != 1 {
		t.Fatalf("swept %d, %d left; want a swept, b left", n, s.Len())
	}
}

// TestLeaseSetsBounded: endless new concurrency keys cost bounded memory,
// as endless new buckets do.
func TestLeaseSetsBounded(t *testing.T) {
	s := memstore.New(memstore.WithSweep(0), memstore.WithMaxKeys(512))
	at := time.Unix(1_800_000_000, 0)
	lim := drip.InFlight(1, time.Hour)
	for i := range 5000 {
		d, err := storetest.Apply(context.Background(), s, bucket.Take, at, drip.Request{Key: fmt.Sprint("k", i), Limit: lim, Lease: "x"})
		if err != nil || !d.Allowed {
			t.Fatalf("acquire %d: %+v %v", i, d, err)
		}
	}
	if n := s.Len(); n > 512 {
		t.Errorf("%d lease sets held, more than the bound of 512", n)
	}
}
