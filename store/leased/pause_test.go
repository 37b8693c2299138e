package leased_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/redisstore"
)

// TestRedisPause pauses Redis for 3 s (CLIENT PAUSE ALL) under 4 busy
// instances of one hot key: the instances keep answering from the blocks
// they hold, then their takes fail (the caller's on_error applies), and
// once the server runs again they answer again; over the whole run the
// key never grants more than burst + rate*T.
func TestRedisPause(t *testing.T) {
	srv := testserver.StartRedis(t)
	rs, err := redisstore.Open(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	lim := drip.PerSecond(1000).WithBurst(5000)
	p, err := lim.Params("hot")
	if err != nil {
		t.Fatal(err)
	}
	var it bucket.Prepared
	if err := store.Prepare(&it, bucket.Take, "hot", &p, 1, false, ""); err != nil {
		t.Fatal(err)
	}
	const instances, callers = 4, 4
	ins := make([]*leased.Store, instances)
	for i := range ins {
		ins[i], err = leased.New(rs, leased.WithShare(0.25), leased.WithHorizon(time.Second), leased.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
	}
	var granted, answeredInPause, failedInPause, answeredAfter, failedAfter atomic.Int64
	var phase atomic.Int32 // 0 before, 1 paused, 2 after
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range instances {
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := make([]bucket.Result, 1)
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
					ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
					err := ins[i].Apply(ctx, bucket.Take, time.Time{}, []bucket.Prepared{it}, res)
					cancel()
					ph := phase.Load()
					switch {
					case err == nil && res[0].Allowed:
						granted.Add(1)
					}
					switch {
					case ph == 1 && err == nil:
						answeredInPause.Add(1)
					case ph == 1:
						failedInPause.Add(1)
					case ph == 2 && err == nil:
						answeredAfter.Add(1)
					case ph == 2:
						failedAfter.Add(1)
					}
				}
			}()
		}
	}
	time.Sleep(1500 * time.Millisecond)
	if _, err := srv.Cli("CLIENT", "PAUSE", "3000", "ALL"); err != nil {
		t.Fatal(err)
	}
	phase.Store(1)
	time.Sleep(3 * time.Second)
	// The pause ends by itself; a PING waits for it.
	if _, err := srv.Cli("PING"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the callers' first calls after it
	phase.Store(2)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	for _, o := range ins {
		o.Close()
	}
	elapsed := time.Since(start)
	bound := 5000 + 1000*elapsed.Seconds()
	t.Logf("in the pause: %d answered, %d failed; after it: %d answered, %d failed; %d granted in %v (bound %.0f)",
		answeredInPause.Load(), failedInPause.Load(), answeredAfter.Load(), failedAfter.Load(), granted.Load(), elapsed, bound)
	if answeredInPause.Load() == 0 {
		t.Error("no instance answered during the pause: blocks should carry them")
	}
	// After it the server answers again: nearly every call (a loaded
	// machine may miss the 100 ms deadline now and then).
	if answeredAfter.Load() == 0 || failedAfter.Load()*2 > answeredAfter.Load() {
		t.Errorf("after the pause: %d answered, %d failed", answeredAfter.Load(), failedAfter.Load())
	}
	if g := granted.Load(); float64(g) > bound {
		t.Errorf("granted %d in %v, over burst + rate*T = %.0f", g, elapsed, bound)
	}
}

// TestCloseWhilePaused: an instance closed while Redis is paused (CLIENT
// PAUSE for 14 s) still holding blocks of 10 keys gives up on giving them
// back after a block's life (1 s here) in all, as their return would not
// matter past it, instead of waiting for the server (or for its client's
// own timeout, 10 s a block: Close took that long before): drip serve's
// shutdown is not held by a stalled store.
func TestCloseWhilePaused(t *testing.T) {
	srv := testserver.StartRedis(t)
	rs, err := redisstore.Open(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	ls, err := leased.New(rs, leased.WithHorizon(time.Second), leased.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	const keys = 10
	its := make([]bucket.Prepared, keys)
	for i := range its {
		k := fmt.Sprintf("hot%d", i)
		p, err := drip.PerSecond(1000).WithBurst(5000).Params(k)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Prepare(&its[i], bucket.Take, k, &p, 1, false, ""); err != nil {
			t.Fatal(err)
		}
	}
	// Demand until the instance holds a block of every key.
	res := make([]bucket.Result, 1)
	deadline := time.Now().Add(30 * time.Second)
	for held := 0; held < keys; {
		if time.Now().After(deadline) {
			t.Fatalf("blocks of %d keys after 30 s of demand", held)
		}
		held = 0
		for i := range its {
			if err := ls.Apply(context.Background(), bucket.Take, time.Time{}, its[i:i+1], res); err != nil {
				t.Fatal(err)
			}
			if ls.Outstanding(its[i].Key) > 0 {
				held++
			}
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := srv.Cli("CLIENT", "PAUSE", "14000", "ALL"); err != nil {
		t.Fatal(err)
	}
	// Killed, not unpaused, at the end: CLIENT UNPAUSE waits out the
	// pause like any other command, and so would the deferred rs.Close
	// (13 s of the test's 14).
	defer srv.Kill()
	start := time.Now()
	ls.Close()
	// A block's life, and room for a loaded machine, short of the
	// client's timeout of one block.
	if d := time.Since(start); d > 6*time.Second {
		t.Errorf("Close took %v while the store was paused, want about a block's life (1 s)", d)
	}
}
