package global

// Leased tokens (store/leased: 4 instances on one redis-server started for
// the run) beside gubernator v2.13.0 (4 daemons in this process, peers on
// loopback gRPC), on limits the callers' demand exceeds, so that
// over-admission can show (and one it does not reach); one checker counts
// both systems' grants:
//
//	cd bench/global && go test -run '^$' -bench 'Global' -benchtime 2s -count 3
//
// Both hold the same limit: drip a token bucket (continuous refill) of
// limit tokens per period with a burst, gubernator a LEAKY_BUCKET with the
// same Limit, Duration and Burst. gubernator runs with its defaults (100 ms
// GlobalSyncWait, 500 µs BatchWait), in two modes: GLOBAL (every daemon
// answers from its own copy of the bucket and sends its hits to the key's
// owner, which broadcasts its state back) and its default (a daemon
// forwards each check to the key's owner, batched). Callers call a
// daemon's V1Server in process, as drip's callers call their leased.Store:
// neither pays a client round trip.
//
// The check: every grant is stamped with the instants just before its
// call and just after its answer, so it was decided somewhere between.
// For a key, a window [a, b] holds at least the grants whose call began at
// or after a and answered at or before b, wherever each was decided
// within its call; if they are more than burst + rate*(b-a), the limit
// was exceeded, whatever the callers' scheduling. worstWindow finds the
// window where that excess is largest. A latency only makes the check
// miss some over-admission (a grant whose call straddles a window's edge
// is not counted in it); it never reports any that did not happen.
//
// Metrics: decisions/s; errors, the share of decisions that answered an
// error (counted, not fatal: under load gubernator's forwards time out);
// granted, the share granted; calls/decision, store calls (drip leased:
// leased.Stats, the blocks given back at the end included; per decision:
// one Apply each) or peer gRPC calls (gubernator: every daemon's request
// counter, read after the hits and broadcasts in flight have been sent);
// used, the grants against what the limit allows over the run (burst +
// rate*elapsed, for each key); over-run, the grants beyond burst + rate*T
// over each key's whole run, summed over keys; worst, the largest excess
// of any one window (its key, length and grants are logged). gubernator
// alone: errors-logged, the errors its daemons logged (a GLOBAL hit
// whose send to its owner timed out is dropped); cache-misses, lookups
// of a bucket its cache did not hold: a key's first use on a daemon, or
// a bucket gone (expired) and made anew, full.

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/redisstore"
)

// globalLimit is one key's limit: limit tokens per period, and a burst.
type globalLimit struct {
	limit  int64
	period time.Duration
	burst  int64
}

// rate is tokens per nanosecond.
func (l globalLimit) rate() float64 { return float64(l.limit) / float64(l.period) }

type globalWorkload struct {
	name string
	keys int
	lim  globalLimit
}

// globalWorkloads: on the first four the demand (64 callers without
// pause) is far above the limit, so that over-admission can show; the last
// is the hot key under a limit it does not reach (that of
// BenchmarkLeased), for the speed of each when nearly every take is
// granted. Burst equals Limit, the one setting in which gubernator's
// broadcast keeps a leaky bucket's burst (UpdatePeerGlobals writes Limit
// as the copy's Burst).
var globalWorkloads = []globalWorkload{
	// 5,000/s, burst 5,000.
	{name: "hot-key", keys: 1, lim: globalLimit{limit: 5000, period: time.Second, burst: 5000}},
	// The same rate over a short Duration: 500 per 100 ms, burst 500.
	// gubernator's cache drops a bucket Duration after the stamp of the
	// last request applied to it, and makes it anew, full.
	{name: "hot-key-short", keys: 1, lim: globalLimit{limit: 500, period: 100 * time.Millisecond, burst: 500}},
	// 20,000/s, burst 20,000: a token comes back every 50 µs, sooner
	// than a store call answers.
	{name: "hot-key-fast", keys: 1, lim: globalLimit{limit: 20_000, period: time.Second, burst: 20_000}},
	// Each key 1 per 10 s, burst 1: 1,000/s in all.
	{name: "10000-keys", keys: 10_000, lim: globalLimit{limit: 1, period: 10 * time.Second, burst: 1}},
	// 1,000,000/s, burst 100,000.
	{name: "hot-key-under-limit", keys: 1, lim: globalLimit{limit: 100_000, period: 100 * time.Millisecond, burst: 100_000}},
}

const (
	globalInstances = 4
	globalCallers   = 64
)

// grant is one granted take: its key, and the instants (ns since the
// run's start) just before its call and just after its answer.
type grant struct {
	key  int32
	s, e int64
}

// caller decides takes of one key for one caller goroutine.
type caller func(k int) (bool, error)

func BenchmarkGlobal(b *testing.B) {
	url := redisURL(b)
	daemons, errs := gubernatorCluster(b, globalInstances)
	run := 0
	for _, w := range globalWorkloads {
		names := make([]string, w.keys)
		for k := range names {
			names[k] = fmt.Sprint("k", k)
		}
		for _, mode := range []string{"drip-per-decision", "drip-leased", "gubernator-default", "gubernator-global"} {
			b.Run(w.name+"/"+mode, func(b *testing.B) {
				run++
				var newCaller func(inst int) caller
				var calls func(decisions int) int64
				switch mode {
				case "drip-leased", "drip-per-decision":
					newCaller, calls = dripMode(b, url, w, names, mode == "drip-leased")
				default:
					newCaller, calls = gubernatorMode(b, daemons, errs, w, names, fmt.Sprint("run", run), mode == "gubernator-global")
				}
				globalRun(b, w, newCaller, calls)
			})
		}
	}
}

// dripMode opens 4 instances on the Redis at url, each its own
// connection and, leased, its own leased.Store with leased's defaults.
func dripMode(b *testing.B, url string, w globalWorkload, names []string, lease bool) (func(int) caller, func(decisions int) int64) {
	redisClean(b, url)
	lim := drip.Limit{Rate: float64(w.lim.limit), Period: w.lim.period, Burst: float64(w.lim.burst)}
	items := make([]bucket.Prepared, len(names))
	for k, key := range names {
		p, err := lim.Params(key)
		if err != nil {
			b.Fatal(err)
		}
		if err := store.Prepare(&items[k], bucket.Take, key, &p, 1, false, ""); err != nil {
			b.Fatal(err)
		}
	}
	sts := make([]store.Store, globalInstances)
	var ls []*leased.Store
	for i := range sts {
		rs, err := redisstore.Open(url, redisstore.WithPrefix("bench:"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { rs.Close() })
		sts[i] = rs
		if lease {
			l, err := leased.New(rs)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { l.Close() })
			ls = append(ls, l)
			sts[i] = l
		}
	}
	newCaller := func(inst int) caller {
		res := make([]bucket.Result, 1)
		return func(k int) (bool, error) {
			err := sts[inst].Apply(context.Background(), bucket.Take, time.Time{}, items[k:k+1], res)
			return err == nil && res[0].Allowed, err
		}
	}
	calls := func(decisions int) int64 {
		if !lease {
			return int64(decisions) // one Apply each
		}
		var n int64
		for _, l := range ls {
			l.Close() // its blocks' returns are calls of the run
			n += l.Stats().StoreCalls
		}
		return n
	}
	return newCaller, calls
}

// gubernatorMode calls the daemons' V1Server in process, each caller one
// daemon, under the rate limit name (fresh for every run, so that no
// state carries over).
func gubernatorMode(b *testing.B, daemons []*gubernator.Daemon, errs *errorCount, w globalWorkload, names []string, name string, global bool) (func(int) caller, func(int) int64) {
	behavior := gubernator.Behavior_BATCHING
	if global {
		behavior = gubernator.Behavior_GLOBAL
	}
	before, errsBefore := gubernatorPeerCalls(b, daemons), errs.n.Load()
	missesBefore := gubernatorMetric(b, daemons[0], `gubernator_cache_access_count{type="miss"}`)
	newCaller := func(inst int) caller {
		v1 := daemons[inst].V1Server
		return func(k int) (bool, error) {
			// A request of its own each time: a GLOBAL check queues it
			// for the owner.
			resp, err := v1.GetRateLimits(context.Background(), &gubernator.GetRateLimitsReq{
				Requests: []*gubernator.RateLimitReq{{
					Name: name, UniqueKey: names[k], Hits: 1,
					Limit: w.lim.limit, Duration: w.lim.period.Milliseconds(), Burst: w.lim.burst,
					Algorithm: gubernator.Algorithm_LEAKY_BUCKET, Behavior: behavior,
				}},
			})
			if err != nil {
				return false, err
			}
			r := resp.Responses[0]
			if r.Error != "" {
				return false, fmt.Errorf("gubernator: %s", r.Error)
			}
			return r.Status == gubernator.Status_UNDER_LIMIT, nil
		}
	}
	calls := func(int) int64 {
		// The hits still queued go to their owners within a
		// GlobalSyncWait, the owners' broadcasts within another.
		time.Sleep(500 * time.Millisecond)
		b.ReportMetric(float64(errs.n.Load()-errsBefore), "errors-logged")
		b.ReportMetric(gubernatorMetric(b, daemons[0], `gubernator_cache_access_count{type="miss"}`)-missesBefore, "cache-misses")
		return gubernatorPeerCalls(b, daemons) - before
	}
	return newCaller, calls
}

// globalRun runs the callers over the instances and reports the metrics.
func globalRun(b *testing.B, w globalWorkload, newCaller func(int) caller, calls func(decisions int) int64) {
	var next, failed atomic.Int64
	var firstErr atomic.Value
	var mu sync.Mutex
	var grants []grant
	b.SetParallelism(max(1, globalCallers/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		n := next.Add(1)
		decide := newCaller(int(n % globalInstances))
		i := int(n * 7919)
		var own []grant
		for pb.Next() {
			i++
			k := i % w.keys
			s := time.Since(start)
			ok, err := decide(k)
			e := time.Since(start)
			if err != nil {
				// Counted, not fatal: under load gubernator's forwards
				// time out, and a caller sees the error.
				if failed.Add(1) == 1 {
					firstErr.Store(err.Error())
				}
				continue
			}
			if ok {
				own = append(own, grant{key: int32(k), s: int64(s), e: int64(e)})
			}
		}
		mu.Lock()
		grants = append(grants, own...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	n := calls(b.N)

	rate, burst := w.lim.rate(), float64(w.lim.burst)
	slices.SortFunc(grants, func(x, y grant) int { return cmp.Compare(x.key, y.key) })
	var overRun float64
	worst := window{excess: math.Inf(-1)}
	for i := 0; i < len(grants); {
		j := i
		for j < len(grants) && grants[j].key == grants[i].key {
			j++
		}
		gs := grants[i:j]
		first, last := gs[0].s, gs[0].e
		for _, g := range gs {
			first, last = min(first, g.s), max(last, g.e)
		}
		// The whole run: every grant of the key within [first, last].
		overRun += max(0, float64(len(gs))-burst-rate*float64(last-first))
		if win := worstWindow(gs, rate, burst); win.excess > worst.excess {
			worst = win
		}
		i = j
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric(float64(len(grants))/float64(b.N), "granted")
	b.ReportMetric(float64(n)/float64(b.N), "calls/decision")
	b.ReportMetric(float64(len(grants))/(float64(w.keys)*(burst+rate*float64(elapsed))), "used")
	b.ReportMetric(float64(failed.Load())/float64(b.N), "errors")
	if failed.Load() > 0 {
		b.Logf("N=%d: %d errors, the first: %v", b.N, failed.Load(), firstErr.Load())
	}
	if failed.Load() == int64(b.N) {
		b.Fatal("every decision failed")
	}
	b.ReportMetric(overRun, "over-run")
	b.ReportMetric(max(0, worst.excess), "worst")
	if worst.excess > 0 {
		b.Logf("N=%d: worst window: key %d, %v long from %v: %d grants, the limit allows %.1f",
			b.N, worst.key, time.Duration(worst.b-worst.a), time.Duration(worst.a), worst.grants, burst+rate*float64(worst.b-worst.a))
	}
}

// window is a window [a, b] (ns since the run's start) of one key's grants.
type window struct {
	key    int
	a, b   int64
	grants int     // grants whose calls began at or after a and answered by b
	excess float64 // grants - (burst + rate*(b-a))
}

// worstWindow returns the window [a, b] of one key's grants (any order)
// whose excess is largest, a ranging over the grants' starts and b over
// their ends. It sweeps b over the ends in order, keeping for every
// candidate a the value rate*a + (grants seen with s >= a) in a tree that
// adds to a prefix and answers a prefix's largest value.
func worstWindow(gs []grant, rate, burst float64) window {
	starts := make([]int64, len(gs))
	for i, g := range gs {
		starts[i] = g.s
	}
	slices.Sort(starts)
	starts = slices.Compact(starts)
	leaf := make([]float64, len(starts))
	for i, s := range starts {
		leaf[i] = rate * float64(s)
	}
	t := newMaxTree(leaf)
	byEnd := slices.Clone(gs)
	slices.SortFunc(byEnd, func(x, y grant) int { return cmp.Compare(x.e, y.e) })
	worst := window{excess: math.Inf(-1)}
	q := -1 // the last start at or before the current end
	for _, g := range byEnd {
		p, _ := slices.BinarySearch(starts, g.s)
		t.add(1, 0, len(starts)-1, 0, p, 1)
		for q+1 < len(starts) && starts[q+1] <= g.e {
			q++
		}
		v, i := t.max(1, 0, len(starts)-1, 0, q)
		if x := v - rate*float64(g.e) - burst; x > worst.excess {
			worst = window{key: int(g.key), a: starts[i], b: g.e, excess: x,
				grants: int(math.Round(v - rate*float64(starts[i])))}
		}
	}
	return worst
}

// maxTree is a segment tree over leaves: add v to a range, the largest
// value of a range and its leaf. A node's mx includes its own pending add.
type maxTree struct {
	mx, pend []float64
	at       []int
}

func newMaxTree(leaf []float64) *maxTree {
	t := &maxTree{mx: make([]float64, 4*len(leaf)), pend: make([]float64, 4*len(leaf)), at: make([]int, 4*len(leaf))}
	t.build(1, 0, len(leaf)-1, leaf)
	return t
}

func (t *maxTree) build(node, lo, hi int, leaf []float64) {
	if lo == hi {
		t.mx[node], t.at[node] = leaf[lo], lo
		return
	}
	mid := (lo + hi) / 2
	t.build(2*node, lo, mid, leaf)
	t.build(2*node+1, mid+1, hi, leaf)
	t.pull(node)
}

func (t *maxTree) pull(node int) {
	l, r := 2*node, 2*node+1
	if t.mx[r] > t.mx[l] {
		l = r
	}
	t.mx[node], t.at[node] = t.mx[l]+t.pend[node], t.at[l]
}

func (t *maxTree) add(node, lo, hi, l, r int, v float64) {
	if r < lo || hi < l {
		return
	}
	if l <= lo && hi <= r {
		t.mx[node] += v
		t.pend[node] += v
		return
	}
	mid := (lo + hi) / 2
	t.add(2*node, lo, mid, l, r, v)
	t.add(2*node+1, mid+1, hi, l, r, v)
	t.pull(node)
}

func (t *maxTree) max(node, lo, hi, l, r int) (float64, int) {
	if l <= lo && hi <= r {
		return t.mx[node], t.at[node]
	}
	mid := (lo + hi) / 2
	best, at := math.Inf(-1), -1
	if l <= mid {
		best, at = t.max(2*node, lo, mid, l, r)
	}
	if r > mid {
		if v, i := t.max(2*node+1, mid+1, hi, l, r); v > best {
			best, at = v, i
		}
	}
	return best + t.pend[node], at
}

// gubernatorCluster starts n daemons on loopback ports, each told of all
// (static peers, no discovery), with gubernator's default behaviours. Its
// logs are counted, not printed: the errors it logs are of peer calls
// (GLOBAL hits whose send to their owner timed out are dropped).
func gubernatorCluster(b *testing.B, n int) ([]*gubernator.Daemon, *errorCount) {
	b.Helper()
	errs := &errorCount{}
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	log.SetOutput(io.Discard)
	log.AddHook(errs)
	var daemons []*gubernator.Daemon
	var peers []gubernator.PeerInfo
	for i := range n {
		grpcAddr := fmt.Sprint("127.0.0.1:", testserver.FreePort(b, 0))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		d, err := gubernator.SpawnDaemon(ctx, gubernator.DaemonConfig{
			Logger:            log.WithField("instance", i),
			InstanceID:        grpcAddr,
			GRPCListenAddress: grpcAddr,
			HTTPListenAddress: "127.0.0.1:0",
			AdvertiseAddress:  grpcAddr,
		})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(d.Close)
		d.PeerInfo = gubernator.PeerInfo{GRPCAddress: grpcAddr, HTTPAddress: d.HTTPListener.Addr().String()}
		daemons = append(daemons, d)
		peers = append(peers, d.PeerInfo)
	}
	for _, d := range daemons {
		d.SetPeers(peers)
	}
	return daemons, errs
}

// errorCount counts the errors logged.
type errorCount struct{ n atomic.Int64 }

func (c *errorCount) Levels() []logrus.Level {
	return []logrus.Level{logrus.PanicLevel, logrus.FatalLevel, logrus.ErrorLevel}
}

func (c *errorCount) Fire(*logrus.Entry) error {
	c.n.Add(1)
	return nil
}

// gubernatorPeerCalls sums the gRPC requests the daemons have served (all
// between peers: the callers call in process), read off their metrics.
func gubernatorPeerCalls(b *testing.B, daemons []*gubernator.Daemon) int64 {
	b.Helper()
	var sum float64
	for _, d := range daemons {
		sum += gubernatorMetric(b, d, "gubernator_grpc_request_counts{")
	}
	return int64(sum)
}

// gubernatorMetric sums the samples of d's metrics whose line begins with
// prefix. The cache's counters are the process's, whichever daemon
// shows them.
func gubernatorMetric(b *testing.B, d *gubernator.Daemon, prefix string) float64 {
	b.Helper()
	resp, err := http.Get("http://" + d.PeerInfo.HTTPAddress + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			b.Fatal(err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	return sum
}

// TestWorstWindow holds worstWindow to a brute force over every pair of a
// start and an end, on random grants, and to a case worked by hand.
func TestWorstWindow(t *testing.T) {
	// Burst 2, 1 token per 10 ns: three grants within [0, 5] are one too
	// many; a fourth whose call straddles 5 does not count there.
	gs := []grant{{s: 0, e: 1}, {s: 2, e: 3}, {s: 4, e: 5}, {s: 3, e: 30}}
	if w := worstWindow(gs, 0.1, 2); w.grants != 3 || w.a != 0 || w.b != 5 || math.Abs(w.excess-0.5) > 1e-9 {
		t.Fatalf("hand case: got %+v, want 3 grants in [0, 5], excess 0.5", w)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		gs := make([]grant, 1+r.IntN(40))
		for i := range gs {
			s := r.Int64N(1000)
			gs[i] = grant{s: s, e: s + r.Int64N(50)}
		}
		rate, burst := r.Float64()/20, float64(r.IntN(5))
		want := math.Inf(-1)
		for _, a := range gs {
			for _, z := range gs {
				if z.e < a.s {
					continue
				}
				n := 0
				for _, g := range gs {
					if g.s >= a.s && g.e <= z.e {
						n++
					}
				}
				want = max(want, float64(n)-burst-rate*float64(z.e-a.s))
			}
		}
		if w := worstWindow(gs, rate, burst); math.Abs(w.excess-want) > 1e-9 {
			t.Fatalf("%v (rate %v, burst %v): worstWindow %+v, brute force %v", gs, rate, burst, w, want)
		}
	}
}
