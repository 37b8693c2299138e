package storetest

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// RunBlocks checks a store's blocks of leased tokens (Caps.Blocks,
// bucket.EvalBlocks): named scenarios, then random steps on a few keys
// (plain takes, peeks and refunds, block takes and returns, time going
// forward past expiries, now and then back) against the exact Model.
// Every other plain request is marked Leased (bucket.Prepared.Leased),
// the others not: a key's blocks cap both alike, whichever instance
// sends them.
func RunBlocks(t *testing.T, newStore NewStore) { runBlocks(t, newStore, 4) }

// RunBlocksTransport is RunBlocks with one random trace rather than four:
// every scenario, and random steps of every kind, reach the store. Call
// it for a store that another test holds to RunBlocks, reached here
// another way (through a pooler, Sentinel or Cluster, as a script rather
// than a function), where the other traces would send the same calls to
// the same code again.
func RunBlocksTransport(t *testing.T, newStore NewStore) { runBlocks(t, newStore, 1) }

// runBlocks is RunBlocks with seeds random traces.
func runBlocks(t *testing.T, newStore NewStore, seeds int) {
	st := newStore(t)
	if !st.Caps().Blocks {
		t.Fatal("the store does not report Caps.Blocks")
	}
	t.Run("Scenarios", func(t *testing.T) { blockScenarios(t, st) })
	for seed := range seeds {
		t.Run(fmt.Sprint("Random/seed", seed), func(t *testing.T) { CompareBlocks(t, st, uint64(seed), 1500) })
	}
}

// blockOp is one step of a block trace.
type blockOp struct {
	op   bucket.Op
	key  int
	cost float64 // tokens: a take's cost, a block's size, a return's unused tokens
	id   string  // a block's ID, or "" for a plain request
	ttl  time.Duration
	at   time.Duration
}

// blockLimits are the limits of the keys of a random block trace, one per
// key: a continuous bucket, an interval refill and a fixed window.
var blockLimits = []drip.Limit{
	drip.PerSecond(10).WithBurst(20),
	{Rate: 5, Period: 200 * time.Millisecond, Burst: 12, Refill: drip.Interval},
	{Algorithm: drip.FixedWindow, Rate: 30, Period: time.Second, Start: 300 * time.Millisecond},
}

func randomBlockOps(seed uint64, n int) []blockOp {
	r := rand.New(rand.NewPCG(seed, 27))
	var at time.Duration
	ops := make([]blockOp, 0, n)
	for range n {
		switch x := r.IntN(20); {
		case x < 3:
			at += time.Duration(r.IntN(400)) * time.Millisecond
		case x == 3:
			at -= time.Duration(r.IntN(5)) * time.Millisecond // a clock a little behind
		}
		o := blockOp{key: r.IntN(len(blockLimits)), at: at}
		switch x := r.IntN(10); {
		case x < 3:
			o.op, o.cost = bucket.Take, float64(r.IntN(3))
		case x == 3:
			o.op, o.cost = bucket.Peek, float64(r.IntN(3))
		case x == 4:
			o.op, o.cost = bucket.Refund, float64(r.IntN(2))
		case x < 8:
			o.op, o.cost = bucket.Take, float64(1+r.IntN(8))
			o.id = fmt.Sprint("b", r.IntN(5))
			o.ttl = time.Duration(1+r.IntN(1500)) * time.Millisecond
		default:
			o.op, o.cost = bucket.Refund, float64(r.IntN(9))
			o.id = fmt.Sprint("b", r.IntN(5))
		}
		ops = append(ops, o)
	}
	return ops
}

// CompareBlocks runs a random block trace of n steps from seed on st and
// on a fresh Model, failing at the first disagreement beyond Tolerance.
func CompareBlocks(t *testing.T, st store.Store, seed uint64, n int) {
	t.Helper()
	c := ctx(t)
	p := prefix()
	b := base()
	m := NewModel()
	res := make([]bucket.Result, 1)
	for i, o := range randomBlockOps(seed, n) {
		at := b.Add(o.at)
		key := fmt.Sprint(p, "k", o.key)
		params, err := blockLimits[o.key].Params(key)
		if err != nil {
			t.Fatal(err)
		}
		var it bucket.Prepared
		if o.id == "" {
			err = store.Prepare(&it, o.op, key, &params, o.cost, false, "")
			it.Leased = i%2 == 0
		} else {
			it, err = store.PrepareBlock(o.op, key, params, int64(o.cost*bucket.Micro), o.id, o.ttl)
		}
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if err := st.Apply(c, o.op, at, []bucket.Prepared{it}, res); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		got := drip.DecisionOf(res[0], params.Burst)
		want := m.Apply(o.op, it, at, false, &got, Tolerance)
		if o.op == bucket.Refund || (o.op == bucket.Take && want.Allowed) {
			m.Apply(o.op, it, at, true, &got, Tolerance)
		}
		if msg := compare(got, want, params, at); msg != "" {
			t.Fatalf("step %d (%v key %d cost %v block %q ttl %v at %v): %s", i, o.op, o.key, o.cost, o.id, o.ttl, o.at, msg)
		}
	}
}

// blockScenarios are the rules of leased tokens on named instants.
func blockScenarios(t *testing.T, st store.Store) {
	c := ctx(t)
	res := make([]bucket.Result, 1)
	lim := drip.PerSecond(10).WithBurst(20)
	type step struct {
		name    string
		op      bucket.Op
		cost    float64
		id      string
		ttl     time.Duration
		at      time.Duration
		allowed bool
		tokens  float64
	}
	for _, sc := range []struct {
		name  string
		lim   drip.Limit
		steps []step
	}{
		{"the bucket refills only up to burst - outstanding", lim, []step{
			{"block of 8", bucket.Take, 8, "a", 2 * time.Second, 0, true, 12},
			{"take 12", bucket.Take, 12, "", 0, 0, true, 0},
			{"0.5 s later 5 are back", bucket.Peek, 0, "", 0, 500 * time.Millisecond, true, 5},
			{"1.5 s later: 12 (20 - 8), not 15", bucket.Peek, 0, "", 0, 1500 * time.Millisecond, true, 12},
			{"a take of 13 is an early denial", bucket.Take, 13, "", 0, 1500 * time.Millisecond, false, 12},
		}},
		{"a return gives the unused tokens back, capped", lim, []step{
			{"block of 8", bucket.Take, 8, "a", time.Second, 0, true, 12},
			{"take 2", bucket.Take, 2, "", 0, 0, true, 10},
			{"return 3 unused", bucket.Refund, 3, "a", 0, 100 * time.Millisecond, true, 14},
			{"a second return changes nothing", bucket.Refund, 3, "a", 0, 100 * time.Millisecond, true, 14},
			{"then it refills to 20", bucket.Peek, 0, "", 0, 700 * time.Millisecond, true, 20},
		}},
		{"an expired block counts as granted and leaves the cap at its expiry", lim, []step{
			{"take 20", bucket.Take, 20, "", 0, 0, true, 0},
			{"0.8 s: block of 8", bucket.Take, 8, "a", 400 * time.Millisecond, 800 * time.Millisecond, true, 0},
			{"1.2 s: the block expired, 4 refilled since", bucket.Peek, 0, "", 0, 1200 * time.Millisecond, true, 4},
			{"2.4 s: 16 back", bucket.Peek, 0, "", 0, 2400 * time.Millisecond, true, 16},
		}},
		{"a block take under a live ID takes nothing more", lim, []step{
			{"block of 5", bucket.Take, 5, "a", time.Second, 0, true, 15},
			{"again", bucket.Take, 5, "a", time.Second, 0, true, 15},
		}},
		{"a fixed window's block ends with its window", drip.Limit{Algorithm: drip.FixedWindow, Rate: 10, Period: time.Second, Start: time.Second}, []step{
			{"0.5 s: block of 10 for a minute", bucket.Take, 10, "a", time.Minute, 500 * time.Millisecond, true, 0},
			{"the next window opens full", bucket.Peek, 0, "", 0, time.Second, true, 10},
		}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			b := base()
			key := prefix() + "k"
			params, err := sc.lim.Params(key)
			if err != nil {
				t.Fatal(err)
			}
			for j, s := range sc.steps {
				var it bucket.Prepared
				if s.id == "" {
					err = store.Prepare(&it, s.op, key, &params, s.cost, false, "")
					it.Leased = j%2 == 0
				} else {
					it, err = store.PrepareBlock(s.op, key, params, int64(s.cost*bucket.Micro), s.id, s.ttl)
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := st.Apply(c, s.op, b.Add(s.at), []bucket.Prepared{it}, res); err != nil {
					t.Fatal(err)
				}
				d := drip.DecisionOf(res[0], params.Burst)
				if d.Allowed != s.allowed || d.Tokens != s.tokens {
					t.Fatalf("%s: allowed %v tokens %v, want %v %v", s.name, d.Allowed, d.Tokens, s.allowed, s.tokens)
				}
			}
		})
	}
}
