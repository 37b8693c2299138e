package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

// slow refills so little during a test that a key grants its burst and
// then nothing.
var slow = drip.Limit{Rate: 1, Period: time.Hour, Burst: 10}

// grants records, per key and per server life, the Remaining of every
// granted take: a correct store grants each value from burst-1 down to 0
// at most once per life of its state.
type grants struct {
	mu   sync.Mutex
	seen map[string]map[int64]int
	n    map[string]int
}

func newGrants() *grants {
	return &grants{seen: map[string]map[int64]int{}, n: map[string]int{}}
}

func (g *grants) add(life int, key string, d drip.Decision) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := fmt.Sprintf("%d/%s", life, key)
	if g.seen[k] == nil {
		g.seen[k] = map[int64]int{}
	}
	g.seen[k][d.Remaining]++
	g.n[key]++
	if g.seen[k][d.Remaining] > 1 {
		return fmt.Errorf("%s granted twice with remaining %d", k, d.Remaining)
	}
	return nil
}

// life is the number of grants in one life of the server.
func (g *grants) life(life int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for k, seen := range g.seen {
		if strings.HasPrefix(k, fmt.Sprintf("%d/", life)) {
			for _, c := range seen {
				n += c
			}
		}
	}
	return n
}

// waitFor polls cond until it holds, or fails the test after a minute:
// a deadline no loaded machine reaches, since how fast is not what is
// tested.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after a minute", what)
		}
	}
}

// TestKillServerMidLoad kills the only server in the middle of a load run:
// decisions fail (errors, never wrong answers) while it is down, and
// resume after it restarts, with the script reloaded into the empty script
// cache. The restarted server has lost the buckets (no persistence), so a
// key can grant its burst once per life of the server, never more.
func TestKillServerMidLoad(t *testing.T) {
	srv := testserver.StartRedis(t)
	s := open(t, srv.URL())
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprintf("kill:%d", i)
	}
	var life atomic.Int32 // 0 before the kill, 1 while down, 2 after restart
	var errs, oks [3]atomic.Int64
	g := newGrants()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Value
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := keys[i%len(keys)]
				l := int(life.Load())
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				d, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: key, Limit: slow, Cost: 1})
				cancel()
				if err != nil {
					errs[l].Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
				oks[l].Add(1)
				if d.Allowed {
					// A take that started while the server was down and
					// ran after the restart belongs to the new life.
					if err := g.add(min(l, 1)*2, key, d); err != nil {
						bad.Store(err)
					}
				}
			}
		}()
	}
	// Every key spends its burst before the kill, takes fail while the
	// server is down, and every key spends its burst again after.
	// (On failure the deferred close stops the workers.)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			wg.Wait()
		}
	}()
	waitFor(t, "burst spent on every key before the kill", func() bool { return g.life(0) == len(keys)*10 })
	life.Store(1)
	srv.Kill()
	waitFor(t, "error while the server is down", func() bool { return errs[1].Load() > 0 })
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	life.Store(2)
	waitFor(t, "2000 decisions after the restart", func() bool { return oks[2].Load() >= 2000 })
	close(stop)
	wg.Wait()
	t.Logf("before the kill: %d decisions, %d errors; while down: %d, %d; after restart: %d, %d",
		oks[0].Load(), errs[0].Load(), oks[1].Load(), errs[1].Load(), oks[2].Load(), errs[2].Load())
	if err, _ := bad.Load().(error); err != nil {
		t.Fatal(err)
	}
	if oks[0].Load() == 0 || errs[1].Load() == 0 || oks[2].Load() < 2000 {
		t.Fatal("want decisions before the kill, errors while down, and decisions again after the restart")
	}
	for _, key := range keys {
		if n := g.n[key]; n != 2*10 {
			t.Errorf("%s: %d grants over two lives of the server, want 2 bursts (20)", key, n)
		}
	}
}

// TestClusterFailover kills a master of a Redis Cluster under load: its
// replica takes over and decisions continue. Replication is asynchronous,
// so takes the master acknowledged but had not yet sent to its replica are
// lost, and their tokens are granted again: the test measures that
// over-admission per key that moved, which must stay within one burst.
// Keys on the other masters must not over-admit at all.
func TestClusterFailover(t *testing.T) {
	if err := testserver.RedisMissing(); err != nil {
		testserver.Missing(t, "redis: %v", err)
	}
	c, err := testserver.LaunchRedisCluster(t.TempDir(), 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	s := open(t, c.URL())
	const burst = 20
	lim := drip.Limit{Rate: 1, Period: time.Hour, Burst: burst}

	// Keys on the master that will die, and keys elsewhere.
	masters, err := c.SlotMap()
	if err != nil {
		t.Fatal(err)
	}
	victim := masters[redisstore.Slot(redisstore.DefaultPrefix+"failover:0")]
	var moved, stayed []string
	for i := 0; len(moved) < 1500 || len(stayed) < 500; i++ {
		key := fmt.Sprintf("failover:%d", i)
		m := masters[redisstore.Slot(redisstore.DefaultPrefix+key)]
		if m == victim && len(moved) < 1500 {
			moved = append(moved, key)
		} else if m != victim && len(stayed) < 500 {
			stayed = append(stayed, key)
		}
	}
	keys := append(append([]string{}, moved...), stayed...)
	load := startTakeLoad(s, keys, lim, 16)
	defer load.Stop()
	// Kill the master while its keys are half spent.
	load.WaitOKs(t, int64(len(keys)*burst/2))
	killedAt := time.Now()
	load.Mark()
	victim.Kill()
	if err := c.WaitOK(30 * time.Second); err != nil {
		for _, n := range c.Nodes {
			t.Logf("%s:\n%s", n.Addr, n.Log())
		}
		t.Fatal(err)
	}
	failover := time.Since(killedAt)
	// Run until every key has been asked well past its burst.
	continued := load.RunAfter(int64(len(keys) * burst * 2))

	grants := func(i int) int64 { return load.grants[i].Load() }
	over, overKeys, worst := int64(0), 0, int64(0)
	for i, k := range moved {
		g := grants(i)
		if g > 2*burst {
			t.Errorf("%s (moved) granted %d, more than two bursts (%d)", k, g, 2*burst)
		}
		if g > burst {
			over += g - burst
			overKeys++
			worst = max(worst, g-burst)
		}
	}
	for i, k := range stayed {
		if g := grants(len(moved) + i); g != burst {
			t.Errorf("%s (did not move) granted %d, want exactly %d", k, g, burst)
		}
	}
	t.Logf("failover took %v; %d decisions (%d after the kill), %d errors; over-admission: %d tokens over %d of %d moved keys (worst key: %d extra, bound %d)",
		failover.Round(time.Millisecond), load.oks.Load(), load.after.Load(), load.errs.Load(), over, overKeys, len(moved), worst, burst)
	if !continued {
		t.Fatalf("decisions did not continue after the failover: %d after the kill", load.after.Load())
	}
}
