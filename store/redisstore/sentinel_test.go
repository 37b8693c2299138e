package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/testserver"
	"github.com/driplimit/drip/storetest"
)

// TestConformanceSentinel runs the suite on a master found through three
// Sentinels, with the redis+sentinel:// URL.
func TestConformanceSentinel(t *testing.T) {
	rs := testserver.StartRedisSentinel(t)
	s := open(t, rs.URL())
	storetest.Run(t, func(t *testing.T) drip.Store { return s })
}

// TestSentinelFailover kills the master under load. Decisions fail only
// until the Sentinels have promoted the replica and the client has
// followed them, and are exact after. Replication is asynchronous, so
// takes the master acknowledged but had not yet sent to its replica are
// lost and their tokens granted again: the test measures that
// over-admission, which must stay within one burst per key.
func TestSentinelFailover(t *testing.T) {
	rs := testserver.StartRedisSentinel(t)
	s := open(t, rs.URL())
	const burst = 20
	lim := drip.Limit{Rate: 1, Period: time.Hour, Burst: burst}
	keys := make([]string, 1000)
	grants := make([]atomic.Int64, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("sentinel-failover:%s:%d", randomTag(), i)
	}
	start := time.Now()
	var oks, errs, oksAfter atomic.Int64
	var killedAt, lastErr atomic.Int64 // since start
	killedAt.Store(-1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i += 16 {
				select {
				case <-stop:
					return
				default:
				}
				k := i % len(keys)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				d, err := s.Apply(ctx, drip.OpTake, time.Time{}, drip.Request{Key: keys[k], Limit: lim, Cost: 1})
				cancel()
				if err != nil {
					errs.Add(1)
					lastErr.Store(int64(time.Since(start)))
					time.Sleep(2 * time.Millisecond)
					continue
				}
				oks.Add(1)
				if killedAt.Load() >= 0 {
					oksAfter.Add(1)
				}
				if d.Allowed {
					grants[k].Add(1)
				}
			}
		}()
	}
	// Kill the master while its keys are half spent.
	for warm := time.Now().Add(30 * time.Second); oks.Load() < int64(len(keys)*burst/2); {
		if time.Now().After(warm) {
			close(stop)
			wg.Wait()
			t.Fatalf("only %d decisions (%d errors) in 30 s before the kill", oks.Load(), errs.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if errs.Load() != 0 {
		t.Errorf("%d errors before the kill", errs.Load())
	}
	killedAt.Store(int64(time.Since(start)))
	rs.Master.Kill()
	promoted := time.Duration(0)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if rs.MasterAddr() == rs.Replica.Addr {
			promoted = time.Since(start) - time.Duration(killedAt.Load())
			break
		}
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatalf("the Sentinels did not promote the replica in 30 s:\n%s", rs.Sentinels[0].Log())
		}
	}
	// Run until every key has been asked well past its burst.
	target := oksAfter.Load() + int64(len(keys)*burst*2)
	deadline := time.Now().Add(60 * time.Second)
	for oksAfter.Load() < target && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	errWindow := time.Duration(lastErr.Load() - killedAt.Load())
	over, overKeys, worst := int64(0), 0, int64(0)
	for i := range keys {
		g := grants[i].Load()
		if g > 2*burst {
			t.Errorf("%s granted %d, more than two bursts (%d)", keys[i], g, 2*burst)
		}
		if g < burst {
			t.Errorf("%s granted %d, less than its burst (%d)", keys[i], g, burst)
		}
		if g > burst {
			over += g - burst
			overKeys++
			worst = max(worst, g-burst)
		}
	}
	t.Logf("Sentinels promoted the replica %v after the kill; errors for %v after the kill (%d errors); %d decisions (%d after the kill); over-admission: %d tokens over %d of %d keys (worst key: %d extra, bound %d)",
		promoted.Round(time.Millisecond), errWindow.Round(time.Millisecond), errs.Load(), oks.Load(), oksAfter.Load(), over, overKeys, len(keys), worst, burst)
	if oksAfter.Load() < target {
		t.Fatalf("decisions did not continue after the failover: %d of %d", oksAfter.Load(), target)
	}
	// Errors only while the master was gone: the client follows the
	// promotion within a few seconds (event-driven, or by its periodic
	// refresh at the latest).
	if errWindow > promoted+sentinelErrorMargin {
		t.Errorf("errors went on %v after the kill, the promotion took %v", errWindow, promoted)
	}
	// Exact after: a fresh key grants exactly its burst.
	fresh := "sentinel-fresh:" + randomTag()
	n := 0
	for range 15 {
		d, err := s.Apply(context.Background(), drip.OpTake, time.Time{}, drip.Request{Key: fresh, Limit: drip.Limit{Rate: 1, Period: time.Hour, Burst: 10}, Cost: 1})
		if err != nil {
			t.Fatalf("after the failover: %v", err)
		}
		if d.Allowed {
			n++
		}
	}
	if n != 10 {
		t.Errorf("a fresh key with burst 10 granted %d after the failover", n)
	}
}

// sentinelErrorMargin is how long after the promotion a client may
// still fail: its periodic refresh (redisstore.SentinelRefresh) plus a
// generous margin for a loaded machine.
const sentinelErrorMargin = 5*time.Second + 5*time.Second
