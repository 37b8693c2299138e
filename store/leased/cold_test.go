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
