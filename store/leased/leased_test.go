package leased_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
)

// event is one take as a caller saw it: the key, the instant, whether it
// was granted, and for a denial the tokens every instance's blocks of the
// key could hold at the store then.
type event struct {
	key     int
	at      int64 // ns since the epoch, on the bubble's clock
	allowed bool
	out     int64
}

// workload is a run of 4 instances sharing one store.
type workload struct {
	name string
	lim  drip.Limit
	keys int
	// pick is the key of a worker's next take.
	pick func(r *rand.Rand) int
	// gap is the most a worker waits between takes.
	gap time.Duration
	// dur is how long (fake time) the callers run.
	dur time.Duration
	// pair: each take is of two keys together (the key picked and the
	// next), all or nothing.
	pair bool
}

var workloads = []workload{
	{name: "hot key", lim: drip.PerSecond(2000).WithBurst(400), keys: 1,
		pick: func(*rand.Rand) int { return 0 }, gap: 500 * time.Microsecond, dur: 2 * time.Second},
	{name: "hot key, interval refill", lim: drip.Limit{Rate: 100, Period: 100 * time.Millisecond, Burst: 300, Refill: drip.Interval}, keys: 1,
		pick: func(*rand.Rand) int { return 0 }, gap: 500 * time.Microsecond, dur: 2 * time.Second},
	{name: "hot fixed window", lim: drip.Limit{Algorithm: drip.FixedWindow, Rate: 1500, Period: time.Second}, keys: 1,
		pick: func(*rand.Rand) int { return 0 }, gap: 500 * time.Microsecond, dur: 2 * time.Second},
	{name: "two hot keys taken together", lim: drip.PerSecond(1000).WithBurst(200), keys: 2, pair: true,
		pick: func(r *rand.Rand) int { return r.IntN(2) }, gap: 500 * time.Microsecond, dur: 2 * time.Second},
	{name: "10000 keys, a few hot", lim: drip.PerSecond(50).WithBurst(20), keys: 10000,
		pick: func(r *rand.Rand) int {
			if r.IntN(2) == 0 {
				return r.IntN(4)
			}
			return r.IntN(10000)
		}, gap: 300 * time.Microsecond, dur: time.Second},
}

// TestNeverOverLimit runs 4 instances (leased.Store, each its own local
// state and block IDs) of 4 busy callers each over one memory store, in a
// bubble of fake time that every clock reads (the store's, the
// instances'), and checks every key's grants against the exact bound: no
// window of length T holds more than burst + rate*T grants, and every
// early denial (a denial where a lone exact bucket fed the same grants
// would have held the cost) is within the tokens then outstanding in
// blocks.
func TestNeverOverLimit(t *testing.T) {
	for _, w := range workloads {
		t.Run(w.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { runWorkload(t, w, w.dur) })
		})
	}
}

func runWorkload(t *testing.T, w workload, dur time.Duration) {
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	var err error
	const instances, callers = 4, 4
	ins := make([]*leased.Store, instances)
	for i := range ins {
		ins[i], err = leased.New(ms, leased.LeaseInProcess(), leased.WithTTL(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
	}
	key := func(k int) string { return fmt.Sprint("k", k) }
	keys, items := takesOf(t, w, key)
	start := time.Now()
	var mu sync.Mutex
	var events []event
	var wg sync.WaitGroup
	for i := range instances {
		for c := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(i), uint64(c)))
				var own []event
				res := make([]bucket.Result, 2)
				for time.Since(start) < dur {
					time.Sleep(time.Duration(r.Int64N(int64(w.gap))))
					ks := []int{w.pick(r)}
					if w.pair {
						ks = append(ks, (ks[0]+1)%w.keys)
					}
					its := make([]bucket.Prepared, len(ks))
					for j, k := range ks {
						its[j] = items[k]
					}
					if err := ins[i].Apply(context.Background(), bucket.Take, time.Time{}, its, res[:len(its)]); err != nil {
						t.Error(err)
						return
					}
					allowed := true
					for j := range its {
						allowed = allowed && res[j].Allowed
					}
					for _, k := range ks {
						// On the microsecond, as the store's clock reads it.
						e := event{key: k, at: time.Now().UnixNano() / 1000 * 1000, allowed: allowed}
						switch {
						case allowed:
						case w.pair:
							e.out = -1 // the other key's denial, maybe: not this key's
						default:
							for _, o := range ins {
								e.out += o.Outstanding(keys[k])
							}
						}
						own = append(own, e)
					}
				}
				mu.Lock()
				events = append(events, own...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	report(t, w, ins, events, func(k int) string { return keys[k] })
}

// takesOf is, for each of w's keys k, its name (key(k)) and the take of
// one token of it, prepared once: a take of key k is always the same
// item, and formatting and preparing it anew at every take cost a sixth
// of the workloads' CPU under the race detector.
func takesOf(t *testing.T, w workload, key func(int) string) ([]string, []bucket.Prepared) {
	t.Helper()
	keys := make([]string, w.keys)
	items := make([]bucket.Prepared, w.keys)
	for k := range keys {
		keys[k] = key(k)
		p, err := w.lim.Params(keys[k])
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Prepare(&items[k], bucket.Take, keys[k], &p, 1, false, ""); err != nil {
			t.Fatal(err)
		}
	}
	return keys, items
}

// checkWindows fails if any window [a, b] of key k's grants holds more
// than burst + rate*(b-a) of them. For grants g_0..g_n in time order the
// worst window ending at g_j starts at the g_i that maximizes
// rate*t_i - i, kept as a running maximum.
func checkWindows(t *testing.T, k int, es []event, p bucket.Params) {
	t.Helper()
	burst := float64(p.Burst) / bucket.Micro
	rate := float64(p.Rate) / bucket.Micro / float64(p.Period) // tokens per ns
	if p.Kind != bucket.Continuous {
		// A grid refill adds rate at once: over T it adds at most
		// rate*ceil(T/period), so bound with one period more.
		burst += float64(p.Rate) / bucket.Micro
	}
	best := 0.0
	n := 0
	t0 := es[0].at
	for _, e := range es {
		if !e.allowed {
			continue
		}
		at := float64(e.at - t0)
		x := rate*at - float64(n)
		if n == 0 || x > best {
			best = x
		}
		// Grants g_i..g_n: n-i+1 of them in rate*(t_n - t_i).
		if over := float64(n) + 1 - rate*at + best - burst; over > 1e-6 {
			t.Fatalf("key %d: %v grants more than burst + rate*T in a window ending at %v", k, over, time.Duration(e.at-t0))
		}
		n++
	}
}

// checkDenials replays key k's grants on a lone exact bucket (the limit
// as one bucket would keep it, every grant at its instant) and counts the
// denials it would have allowed; each must be within the tokens then
// outstanding in blocks (plus one for the grants of the same instant,
// whose order against the denial is not known).
func checkDenials(t *testing.T, k int, es []event, p bucket.Params) int {
	t.Helper()
	var b bucket.State
	found := false
	early := 0
	for i := 0; i < len(es); {
		j := i
		for j < len(es) && es[j].at == es[i].at {
			j++
		}
		now := es[i].at
		// Every grant of this instant counts as before the denials.
		for _, e := range es[i:j] {
			if e.allowed {
				_, b, _ = bucket.Eval(bucket.Refund, b, found, p, 0, false, now)
				found = true
				b.Tokens -= bucket.Micro
			}
		}
		_, a, _ := bucket.Eval(bucket.Peek, b, found, p, 0, false, now)
		for _, e := range es[i:j] {
			if e.allowed || e.out < 0 || a.Tokens < bucket.Micro {
				continue
			}
			early++
			if a.Tokens-bucket.Micro >= e.out+bucket.Micro {
				t.Errorf("key %d at %v: denied while a lone bucket holds %v tokens and blocks only %v",
					k, time.Unix(0, e.at), float64(a.Tokens)/bucket.Micro, float64(e.out)/bucket.Micro)
			}
		}
		i = j
	}
	return early
}

// TestCapsForwarded: a leased store has its store's capabilities, its
// overrides and its notice board the store's own.
func TestCapsForwarded(t *testing.T) {
	inner := memstore.New()
	defer inner.Close()
	s, err := leased.New(inner, leased.LeaseInProcess())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if c, ic := s.Caps(), inner.Caps(); c.Board != ic.Board || c.Overrides != ic.Overrides || c.Blocks != ic.Blocks {
		t.Errorf("caps %+v, want the store's %+v", c, ic)
	}
}
