package storetest

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
)

const (
	ms = time.Millisecond
	s  = time.Second
)

// step is one request at a named instant and what the semantics
// (docs/semantics.md) say it gets.
type step struct {
	at      time.Duration // since the scenario's base
	op      string        // take (default), peek, refund, reset
	key     string        // default "k"
	cost    float64       // default 1; use costZero for 0
	reserve bool
	limit   *drip.Limit // default: the scenario's

	allowed bool
	tokens  float64
	retry   time.Duration
	reset   time.Duration
	err     error
}

const costZero = -1e-300 // marks an explicit cost of 0

type scenario struct {
	name  string
	limit drip.Limit
	steps []step
}

var (
	tenPerSecond = drip.PerSecond(10)
	fivePer10s   = drip.Limit{Rate: 5, Period: 10 * s, Burst: 20, Refill: drip.Interval}
	windowMinute = drip.Limit{Algorithm: drip.FixedWindow, Rate: 3, Period: time.Minute, Start: time.Minute}
)

// Scenarios are the tables of docs/semantics.md, each over named instants.
var Scenarios = []scenario{
	{"continuous: a burst, then refill lands exactly", tenPerSecond, []step{
		{at: 0, cost: 10, allowed: true, tokens: 0, reset: 1 * s},
		{at: 0, allowed: false, tokens: 0, retry: 100 * ms, reset: 1 * s},
		// 0.1 s after the bucket emptied, exactly one token is back.
		{at: 100 * ms, op: "peek", allowed: true, tokens: 0, reset: 1 * s},
		{at: 100 * ms, allowed: true, tokens: 0, reset: 1 * s},
		{at: 150 * ms, allowed: false, tokens: 0.5, retry: 50 * ms, reset: 950 * ms},
		{at: 350 * ms, cost: 2, allowed: true, tokens: 0.5, reset: 950 * ms},
		{at: 10 * s, op: "peek", allowed: true, tokens: 9, reset: 100 * ms},
	}},
	{"continuous: fractional rate and cost", drip.Limit{Rate: 0.5, Burst: 2}, []step{
		{at: 0, cost: 1.5, allowed: true, tokens: 0.5, reset: 3 * s},
		{at: 0, allowed: false, tokens: 0.5, retry: 1 * s, reset: 3 * s},
		{at: 1 * s, allowed: true, tokens: 0, reset: 4 * s},
		{at: 1500 * ms, cost: 0.25, allowed: true, tokens: 0, reset: 4 * s},
	}},
	{"continuous: the clock going backwards adds and removes nothing", tenPerSecond, []step{
		{at: 1 * s, cost: 10, allowed: true, tokens: 0, reset: 1 * s},
		{at: 500 * ms, allowed: false, tokens: 0, retry: 600 * ms, reset: 1500 * ms},
		{at: 0, op: "peek", cost: costZero, allowed: true, tokens: 0, reset: 2 * s},
		{at: 1050 * ms, allowed: false, tokens: 0.5, retry: 50 * ms, reset: 950 * ms},
		{at: 1100 * ms, allowed: true, tokens: 0, reset: 1 * s},
		{at: 1 * s, allowed: false, tokens: 0, retry: 200 * ms, reset: 1100 * ms},
	}},
	{"interval: 5 per 10 s, burst 20, refills on the grid", fivePer10s, []step{
		{at: 0, cost: 5, allowed: true, tokens: 15, reset: 10 * s},
		{at: 10 * s, op: "peek", cost: costZero, allowed: true, tokens: 20},
		{at: 15 * s, cost: 18, allowed: true, tokens: 2, reset: 35 * s},
		{at: 19 * s, cost: 3, allowed: false, tokens: 2, retry: 1 * s, reset: 31 * s},
		{at: 20 * s, op: "peek", allowed: true, tokens: 6, reset: 30 * s},
		{at: 20 * s, cost: 10, allowed: false, tokens: 7, retry: 10 * s, reset: 30 * s},
		{at: 29 * s, cost: 7, allowed: true, tokens: 0, reset: 31 * s},
		{at: 65 * s, op: "peek", cost: costZero, allowed: true, tokens: 20},
	}},
	{"fixed window: tokens per window on an aligned grid", windowMinute, []step{
		{at: 10 * s, cost: 3, allowed: true, tokens: 0, reset: 50 * s},
		{at: 20 * s, allowed: false, tokens: 0, retry: 40 * s, reset: 40 * s},
		{at: 60 * s, allowed: true, tokens: 2, reset: 60 * s},
		{at: 119 * s, cost: 2, allowed: true, tokens: 0, reset: 1 * s},
		{at: 300 * s, op: "peek", allowed: true, tokens: 2, reset: 60 * s},
	}},
	{"fixed window with rollover capacity", drip.Limit{Algorithm: drip.FixedWindow, Rate: 3, Period: time.Minute, Burst: 5, Start: time.Minute}, []step{
		{at: 10 * s, cost: 5, allowed: true, tokens: 0, reset: 110 * s},
		{at: 70 * s, op: "peek", cost: costZero, allowed: true, tokens: 3, reset: 50 * s},
		{at: 70 * s, cost: 4, allowed: false, tokens: 3, retry: 50 * s, reset: 50 * s},
		{at: 200 * s, op: "peek", cost: costZero, allowed: true, tokens: 5},
	}},
	{"fixed window: a start offset moves the grid", drip.Limit{Algorithm: drip.FixedWindow, Rate: 2, Period: 10 * s, Start: 3 * s}, []step{
		{at: 0, cost: 2, allowed: true, tokens: 0, reset: 3 * s},
		{at: 2 * s, allowed: false, tokens: 0, retry: 1 * s, reset: 1 * s},
		{at: 3 * s, allowed: true, tokens: 1, reset: 10 * s},
	}},
	{"reservations go into debt and say when to run", tenPerSecond, []step{
		{at: 0, cost: 10, allowed: true, tokens: 0, reset: 1 * s},
		{at: 0, cost: 5, reserve: true, allowed: true, tokens: -5, retry: 500 * ms, reset: 1500 * ms},
		{at: 0, allowed: false, tokens: -5, retry: 600 * ms, reset: 1500 * ms},
		{at: 100 * ms, cost: 20, reserve: true, allowed: true, tokens: -24, retry: 2400 * ms, reset: 3400 * ms},
		{at: 2600 * ms, allowed: true, tokens: 0, reset: 1 * s},
	}},
	{"max_reserved bounds the debt", tenPerSecond.WithMaxReserved(5), []step{
		{at: 0, cost: 10, allowed: true, tokens: 0, reset: 1 * s},
		{at: 0, cost: 5, reserve: true, allowed: true, tokens: -5, retry: 500 * ms, reset: 1500 * ms},
		// A reservation of 1 would need the debt to fit: 0.1 s.
		{at: 0, reserve: true, allowed: false, tokens: -5, retry: 100 * ms, reset: 1500 * ms},
		{at: 100 * ms, reserve: true, allowed: true, tokens: -5, retry: 500 * ms, reset: 1500 * ms},
	}},
	{"unbounded reservations stop at 1e12 tokens of debt", drip.Limit{Rate: 1e12, Burst: 1e12}, []step{
		{at: 0, cost: 1e12, allowed: true, tokens: 0, reset: 1 * s},
		{at: 0, cost: 1e12, reserve: true, allowed: true, tokens: -1e12, retry: 1 * s, reset: 2 * s},
		{at: 0, cost: 1e12, reserve: true, allowed: false, tokens: -1e12, retry: 1 * s, reset: 2 * s},
		// One more token of debt would pass the bound: it fits once one
		// token has come back.
		{at: 0, cost: 1, reserve: true, allowed: false, tokens: -1e12, retry: 1, reset: 2 * s},
		{at: 500 * ms, cost: 1e12, reserve: true, allowed: false, tokens: -0.5e12, retry: 500 * ms, reset: 1500 * ms},
		{at: 500 * ms, cost: 0.5e12, reserve: true, allowed: true, tokens: -1e12, retry: 1 * s, reset: 2 * s},
	}},
	{"interval reservations land on the grid", fivePer10s, []step{
		{at: 0, cost: 20, allowed: true, tokens: 0, reset: 40 * s},
		{at: 1 * s, cost: 7, reserve: true, allowed: true, tokens: -7, retry: 19 * s, reset: 59 * s},
	}},
	{"a cost above burst is an error unless reserved", tenPerSecond, []step{
		{at: 0, cost: 11, err: drip.ErrCostExceedsBurst},
		{at: 0, cost: 11, reserve: true, allowed: true, tokens: -1, retry: 100 * ms, reset: 1100 * ms},
	}},
	{"a reservation above the burst can be refunded in full", drip.Limit{Rate: 4, Burst: 1}, []step{
		{at: 0, cost: 5, reserve: true, allowed: true, tokens: -4, retry: 1 * s, reset: 1250 * ms},
		{at: 0, op: "refund", cost: 5, allowed: true, tokens: 1},
		{at: 0, allowed: true, tokens: 0, reset: 250 * ms},
		// A refund above the burst on a fresh bucket leaves it full.
		{at: 0, op: "refund", key: "fresh", cost: 7.5, allowed: true, tokens: 1},
	}},
	{"a reservation that can never fit is an error", drip.Limit{Rate: 4, Burst: 1, MaxReserved: 3}, []step{
		{at: 0, cost: 5, reserve: true, err: drip.ErrCostExceedsBurst},
		{at: 0, op: "peek", cost: 5, reserve: true, err: drip.ErrCostExceedsBurst},
		// burst + max_reserved fits, on a full bucket.
		{at: 0, cost: 4, reserve: true, allowed: true, tokens: -3, retry: 750 * ms, reset: 1 * s},
		{at: 1 * s, cost: 4, reserve: true, allowed: true, tokens: -3, retry: 750 * ms, reset: 1 * s},
		// Without a bound, any valid cost may be reserved.
		{at: 0, key: "unbounded", limit: ptr(drip.Limit{Rate: 4, Burst: 1}), cost: 1e6, reserve: true, allowed: true, tokens: 1 - 1e6, retry: 249999750 * ms, reset: 250000 * s},
	}},
	{"peek writes nothing", tenPerSecond, []step{
		{at: 0, op: "peek", cost: 4, allowed: true, tokens: 6, reset: 400 * ms},
		{at: 0, op: "peek", cost: 10, allowed: true, tokens: 0, reset: 1 * s},
		{at: 0, cost: 4, allowed: true, tokens: 6, reset: 400 * ms},
		{at: 0, op: "peek", cost: 7, allowed: false, tokens: 6, retry: 100 * ms, reset: 400 * ms},
		{at: 0, cost: 6, allowed: true, tokens: 0, reset: 1 * s},
	}},
	{"a denial writes nothing (the grid does not move)", fivePer10s, []step{
		{at: 0, cost: 20, allowed: true, tokens: 0, reset: 40 * s},
		{at: 9 * s, allowed: false, tokens: 0, retry: 1 * s, reset: 31 * s},
		{at: 10 * s, cost: 5, allowed: true, tokens: 0, reset: 40 * s},
	}},
	{"reset makes the bucket full", tenPerSecond, []step{
		{at: 0, cost: 10, allowed: true, tokens: 0, reset: 1 * s},
		{at: 0, op: "reset"},
		{at: 0, allowed: true, tokens: 9, reset: 100 * ms},
		{at: 0, op: "reset", key: "never-seen"},
	}},
	{"refund gives tokens back, up to the burst", tenPerSecond, []step{
		{at: 0, cost: 8, allowed: true, tokens: 2, reset: 800 * ms},
		{at: 0, op: "refund", cost: 3, allowed: true, tokens: 5, reset: 500 * ms},
		{at: 0, op: "refund", cost: 10, allowed: true, tokens: 10},
		{at: 0, op: "peek", cost: 10, allowed: true, tokens: 0, reset: 1 * s},
		{at: 0, op: "refund", key: "fresh", cost: 1, allowed: true, tokens: 10},
	}},
	{"a cost of zero is allowed on an empty bucket", tenPerSecond, []step{
		{at: 0, cost: 10, allowed: true, tokens: 0, reset: 1 * s},
		{at: 0, cost: costZero, allowed: true, tokens: 0, reset: 1 * s},
	}},
	{"keys are independent", tenPerSecond, []step{
		{at: 0, key: "a", cost: 10, allowed: true, tokens: 0, reset: 1 * s},
		{at: 0, key: "b", allowed: true, tokens: 9, reset: 100 * ms},
	}},
	{"a lowered burst caps what a bucket holds", drip.PerSecond(10).WithBurst(20), []step{
		{at: 0, cost: 1, allowed: true, tokens: 19, reset: 100 * ms},
		{at: 0, limit: ptr(drip.PerSecond(10).WithBurst(5)), allowed: true, tokens: 4, reset: 100 * ms},
	}},
}

func ptr[T any](v T) *T { return &v }

// RunScenarios runs every scenario on a fresh key space.
func RunScenarios(t *testing.T, newStore NewStore) {
	for _, sc := range Scenarios {
		t.Run(sc.name, func(t *testing.T) {
			st := newStore(t)
			p := prefix()
			b := base()
			c := ctx(t)
			for i, stp := range sc.steps {
				key := stp.key
				if key == "" {
					key = "k"
				}
				lim := sc.limit
				if stp.limit != nil {
					lim = *stp.limit
				}
				cost := stp.cost
				switch cost {
				case 0:
					cost = 1
				case costZero:
					cost = 0
				}
				at := b.Add(stp.at)
				where := fmt.Sprintf("step %d (%s %s at +%v cost %v)", i, orTake(stp.op), key, stp.at, cost)
				if stp.op == "reset" {
					if err := st.Reset(c, p+key); err != nil {
						t.Fatalf("%s: %v", where, err)
					}
					continue
				}
				op := map[string]bucket.Op{"": bucket.Take, "take": bucket.Take, "peek": bucket.Peek, "refund": bucket.Refund}[stp.op]
				d, err := Apply(c, st, op, at, drip.Request{Key: p + key, Limit: lim, Cost: cost, Reserve: stp.reserve})
				if stp.err != nil {
					if !errors.Is(err, stp.err) {
						t.Fatalf("%s: err = %v, want %v", where, err, stp.err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				want := drip.Decision{Allowed: stp.allowed, Tokens: stp.tokens, Remaining: int64(math.Floor(math.Max(0, stp.tokens))),
					Burst: limBurst(lim), RetryAfter: stp.retry, ResetAfter: stp.reset}
				if !sameDecision(d, want) {
					t.Fatalf("%s:\n got  %+v\n want %+v", where, d, want)
				}
			}
		})
	}
}

func orTake(op string) string {
	if op == "" {
		return "take"
	}
	return op
}

func limBurst(l drip.Limit) float64 {
	if l.Burst == 0 {
		return l.Rate
	}
	return l.Burst
}

// sameDecision compares exactly, but for tokens to the micro-token.
func sameDecision(a, b drip.Decision) bool {
	return a.Allowed == b.Allowed && math.Abs(a.Tokens-b.Tokens) < 0.5e-6 && a.Remaining == b.Remaining &&
		a.Burst == b.Burst && a.RetryAfter == b.RetryAfter && a.ResetAfter == b.ResetAfter
}
