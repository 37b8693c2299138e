package leased_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
)

// counting is a store that counts its calls, and the block takes and
// marked items among them.
type counting struct {
	store.Store
	mu                    sync.Mutex
	calls, blocks, marked int
}

func (c *counting) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	c.mu.Lock()
	c.calls++
	for _, it := range items {
		if it.Block != "" {
			c.blocks++
		}
		if it.Leased {
			c.marked++
		}
	}
	c.mu.Unlock()
	return c.Store.Apply(ctx, op, at, items, results)
}

func (c *counting) counts() (calls, blocks, marked int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls, c.blocks, c.marked
}

// TestColdKeysPlainPath: a leased instance leases no key until it proves
// hot. Keys taken a few times a horizon (here 6 takes at once, then
// nothing for a second, which blocks of 6 tokens served before; each key
// in turn, so that keys whose meters collide do not add up) go to
// the store as they would without leasing: one call per take, the item
// as it came, no block, and the instance holds nothing of them; a key
// taken 100 times at once proves hot and is served from blocks.
func TestColdKeysPlainPath(t *testing.T) {
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	c := &counting{Store: ms}
	var clock virtual
	clock.now.Store(time.Unix(1_700_000_000, 0).UnixNano())
	ls, err := leased.New(c, leased.LeaseInProcess(), leased.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	lim := drip.PerSecond(1000).WithBurst(1000)
	take := func(key string) {
		t.Helper()
		p, err := lim.Params(key)
		if err != nil {
			t.Fatal(err)
		}
		var it bucket.Prepared
		if err := store.Prepare(&it, bucket.Take, key, &p, 1, false, ""); err != nil {
			t.Fatal(err)
		}
		res := make([]bucket.Result, 1)
		if err := ls.Apply(context.Background(), bucket.Take, clock.Now(), []bucket.Prepared{it}, res); err != nil || !res[0].Allowed {
			t.Fatalf("%s: %+v, %v", key, res[0], err)
		}
	}
	const keys, each = 200, 6
	for range 2 {
		for k := range keys {
			for range each {
				take(fmt.Sprint("cold", k))
			}
			clock.now.Add(int64(time.Second))
		}
	}
	if calls, blocks, marked := c.counts(); calls != 2*keys*each || blocks != 0 || marked != 0 {
		t.Errorf("cold keys: %d store calls, %d block takes, %d marked items; want %d calls (one a take), no block, none marked", calls, blocks, marked, 2*keys*each)
	}
	for k := range keys {
		if o := ls.Outstanding(fmt.Sprint("cold", k)); o != 0 {
			t.Fatalf("cold%d: %d micro-tokens outstanding, want none", k, o)
		}
	}
	before, _, _ := c.counts()
	for range 100 {
		take("hot")
	}
	calls, blocks, _ := c.counts()
	if st := ls.Stats(); blocks == 0 || calls-before > 50 || st.Local == 0 {
		t.Errorf("a hot key: %d store calls for 100 takes, %d block takes, %d local; want blocks, most takes local", calls-before, blocks, st.Local)
	}
}

// TestHotAfterEightTakesInHorizon: a key proves hot once it has been
// taken 8 times (of its cost) within one horizon, however the 8 are
// spread over it; from then on the instance keeps its state, and repeats
// the store's denial of it rather than asking again. Here 8 takes 12 ms
// apart (within the default 100 ms horizon) empty a burst of 8; of the 12
// takes that follow at the same instant the first is denied by the store
// and the others locally. (Before, the demand was an average that forgot
// as it went: the 8 spread takes counted as 5.4, and the key proved hot
// only 3 takes later, each a store call.)
func TestHotAfterEightTakesInHorizon(t *testing.T) {
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	c := &counting{Store: ms}
	var clock virtual
	t0 := time.Unix(1_700_000_000, 0) // a multiple of the horizon: one window
	clock.now.Store(t0.UnixNano())
	ls, err := leased.New(c, leased.LeaseInProcess(), leased.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	p, err := drip.PerHour(8).WithBurst(8).Params("k")
	if err != nil {
		t.Fatal(err)
	}
	var it bucket.Prepared
	if err := store.Prepare(&it, bucket.Take, "k", &p, 1, false, ""); err != nil {
		t.Fatal(err)
	}
	take := func() bool {
		t.Helper()
		res := make([]bucket.Result, 1)
		if err := ls.Apply(context.Background(), bucket.Take, time.Time{}, []bucket.Prepared{it}, res); err != nil {
			t.Fatal(err)
		}
		return res[0].Allowed
	}
	for k := range 8 {
		clock.now.Store(t0.Add(time.Duration(k) * 12 * time.Millisecond).UnixNano())
		if !take() {
			t.Fatalf("take %d denied from a burst of 8", k+1)
		}
	}
	before, _, _ := c.counts()
	for k := range 12 {
		if take() {
			t.Fatalf("take %d after the burst granted", 9+k)
		}
	}
	if calls, _, _ := c.counts(); calls-before != 1 {
		t.Errorf("12 takes of an empty bucket after 8 takes in 84 ms: %d store calls, want 1 (the key hot, the first denial repeated)", calls-before)
	}
}
