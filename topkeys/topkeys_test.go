package topkeys

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
)

// clock is a fake clock that ticks move.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTracker() (*Tracker, *clock) {
	c := &clock{t: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	return New(WithClock(c.now)), c
}

func tick(t *Tracker, c *clock) {
	c.t = c.t.Add(Interval)
	t.Tick()
}

func decide(t *Tracker, rule, key string, ev engine.Event, tokens, burst float64) {
	it := &engine.Item{Key: key, Verdict: engine.Verdict{Decided: burst > 0, Decision: drip.Decision{Allowed: ev == engine.Allowed, Tokens: tokens, Burst: burst}}}
	t.Key(rule, rules.Enforce, ev, it)
}

// zipf draws key indices with a Zipf law over n keys, from a fixed seed.
func zipf(seed uint64, s float64, n uint64) func() uint64 {
	z := rand.NewZipf(rand.New(rand.NewPCG(seed, seed)), s, 1, n-1)
	return z.Uint64
}

// checkCounts holds a window's lists to Space-Saving's guarantee against
// the exact counts: each listed key's true count is within [Count-Error,
// Count], each key not listed has at most the bound, and the lists are
// in order.
func checkCounts(t *testing.T, what string, got []Count, bound uint64, exact map[string]uint64) {
	t.Helper()
	listed := map[string]bool{}
	for i, c := range got {
		listed[c.Key] = true
		if tr := exact[c.Key]; tr > c.Count || c.Count-c.Error > tr {
			t.Errorf("%s: %q counted %d (error %d), true count %d", what, c.Key, c.Count, c.Error, tr)
		}
		if i > 0 && got[i-1].Count < c.Count {
			t.Errorf("%s: %q (%d) listed after %q (%d)", what, c.Key, c.Count, got[i-1].Key, got[i-1].Count)
		}
	}
	for k, n := range exact {
		if !listed[k] && n > bound {
			t.Errorf("%s: %q not listed with %d, over the bound %d", what, k, n, bound)
		}
	}
}

// TestBounds: over a skewed stream of 100,000 keys, every window holds to
// the error bounds it states, interval after interval.
func TestBounds(t *testing.T) {
	tr, c := newTracker()
	next := zipf(1, 1.1, 100_000)
	type counts struct{ req, den map[string]uint64 }
	var hist []counts // per interval, newest last
	for range 40 {
		cur := counts{map[string]uint64{}, map[string]uint64{}}
		for range 3000 {
			k := fmt.Sprintf("r|k%d", next())
			ev := engine.Allowed
			if len(k)%3 == 0 {
				ev = engine.Denied
				cur.den[k]++
			}
			cur.req[k]++
			decide(tr, "r", k, ev, 1, 10)
		}
		hist = append(hist, cur)
		for _, w := range []struct {
			name      string
			intervals int
		}{{Minute, fineSlots}, {FiveMinutes, 0}, {Hour, 0}} {
			n := w.intervals
			done := len(hist) - 1 // closed intervals
			switch w.name {
			case FiveMinutes:
				n = done%fineSlots + 1 + min(done/fineSlots, minuteSlots)*fineSlots
			case Hour:
				n = done%(fineSlots*5) + 1 + min(done/(fineSlots*5), fiveSlots)*fineSlots*5
			}
			n = min(n, len(hist))
			req, den := map[string]uint64{}, map[string]uint64{}
			for _, h := range hist[len(hist)-n:] {
				for k, v := range h.req {
					req[k] += v
				}
				for k, v := range h.den {
					den[k] += v
				}
			}
			v, ok := tr.Rule("r", w.name, Capacity)
			if !ok {
				t.Fatal("no view")
			}
			var total uint64
			for _, x := range req {
				total += x
			}
			if v.Requests != total {
				t.Fatalf("%s after %d intervals: %d requests, want %d", w.name, len(hist), v.Requests, total)
			}
			checkCounts(t, w.name+" requests", v.TopRequests, v.RequestsBound, req)
			checkCounts(t, w.name+" denials", v.TopDenied, v.DenialsBound, den)
		}
		tick(tr, c)
	}
}

// TestHeavyHitters: 10 keys that send 30% of a Zipf workload over 100,000
// keys are the first 10 listed, each counted within its stated error.
func TestHeavyHitters(t *testing.T) {
	tr, _ := newTracker()
	next := zipf(7, 1.05, 100_000) // s so that the 10 most frequent send about 30%
	exact := map[string]uint64{}
	const n = 200_000
	for range n {
		k := fmt.Sprintf("k%d", next())
		exact[k]++
		decide(tr, "r", k, engine.Allowed, 5, 10)
	}
	var top uint64
	for i := range 10 {
		top += exact[fmt.Sprintf("k%d", i)]
	}
	if share := float64(top) / n; share < 0.28 || share > 0.32 {
		t.Fatalf("the 10 keys sent %.3f of the requests, want 0.30", share)
	}
	v, _ := tr.Rule("r", Minute, 20)
	first := map[string]bool{}
	for _, c := range v.TopRequests[:10] {
		first[c.Key] = true
	}
	for i := range 10 {
		if k := fmt.Sprintf("k%d", i); !first[k] {
			t.Errorf("%s (%d requests) not among the first 10: %+v", k, exact[k], v.TopRequests)
		}
	}
	checkCounts(t, "requests", v.TopRequests, v.RequestsBound, exact)
}

// TestWindows: an interval's counts leave the minute after six intervals,
// the five minutes after five minutes, the hour after an hour.
func TestWindows(t *testing.T) {
	tr, c := newTracker()
	decide(tr, "r", "a", engine.Denied, 0, 10)
	has := func(window string) bool {
		v, _ := tr.Rule("r", window, 10)
		return len(v.TopDenied) == 1 && v.TopDenied[0].Key == "a" && v.TopDenied[0].Count == 1
	}
	for i := 1; i <= 360; i++ {
		tick(tr, c)
		decide(tr, "r", "b", engine.Allowed, 10, 10) // keep the rule busy
		if want := i < 6; has(Minute) != want {
			t.Fatalf("after %d intervals, in the minute: %v, want %v", i, !want, want)
		}
		if want := i < 30; has(FiveMinutes) != want && (i < 24 || i >= 30) {
			t.Fatalf("after %d intervals, in the five minutes: %v, want %v", i, !want, want)
		}
		if want := i < 360; has(Hour) != want && (i < 330 || i >= 360) {
			t.Fatalf("after %d intervals, in the hour: %v, want %v", i, !want, want)
		}
	}
	v, _ := tr.Rule("r", Hour, 10)
	if v.TotalDenials != 1 || v.TotalRequests != 361 {
		t.Errorf("totals %d requests, %d denials; want 361, 1", v.TotalRequests, v.TotalDenials)
	}
	if v.Seconds < 3300 || v.Seconds > 3600 {
		t.Errorf("the hour covers %v s", v.Seconds)
	}
}

// TestNear: the keys with the least left relative to their burst come
// first, at their latest decision.
func TestNear(t *testing.T) {
	tr, _ := newTracker()
	for i := range 100 {
		decide(tr, "r", fmt.Sprintf("k%d", i), engine.Allowed, float64(i), 100)
	}
	decide(tr, "r", "k3", engine.Allowed, 90, 100) // k3 refilled
	decide(tr, "r", "z", engine.Denied, 0.5, 2)
	v, _ := tr.Rule("r", Minute, 4)
	var got []string
	for _, n := range v.Near {
		got = append(got, n.Key)
	}
	// z has a quarter left, k4 4%: the four least are k0 k1 k2 k4.
	if fmt.Sprint(got) != "[k0 k1 k2 k4]" {
		t.Errorf("nearest %v, want [k0 k1 k2 k4]", got)
	}
}

// TestForgets: a rule idle for an hour is forgotten; MaxRules bounds the
// rules followed.
func TestForgets(t *testing.T) {
	tr, c := newTracker()
	decide(tr, "r", "a", engine.Allowed, 1, 2)
	for range idleTicks + 1 { // the interval of the decision, then an hour of none
		tick(tr, c)
	}
	if _, ok := tr.Rule("r", Minute, 1); ok {
		t.Error("an idle rule is still followed after an hour")
	}
	for i := range MaxRules + 5 {
		decide(tr, fmt.Sprintf("r%d", i), "a", engine.Allowed, 1, 2)
	}
	if w, _ := tr.Windows(Minute, 1); len(w) != MaxRules || tr.Dropped.Load() != 5 {
		t.Errorf("%d rules followed, %d decisions dropped; want %d, 5", len(w), tr.Dropped.Load(), MaxRules)
	}
}

// TestNearLatest: a key is listed near its limit at its latest decision
// of the last minute, across intervals: once it has refilled it is not
// listed, and a minute after its last decision it is gone.
func TestNearLatest(t *testing.T) {
	tr, c := newTracker()
	decide(tr, "r", "a", engine.Denied, 0, 10)
	decide(tr, "r", "b", engine.Allowed, 1, 10)
	tick(tr, c)
	decide(tr, "r", "a", engine.Allowed, 9, 10) // a refilled
	near := func() string {
		v, _ := tr.Rule("r", Minute, 10)
		var got []string
		for _, n := range v.Near {
			got = append(got, fmt.Sprintf("%s:%v", n.Key, n.Tokens))
		}
		return fmt.Sprint(got)
	}
	if got := near(); got != "[b:1]" {
		t.Errorf("after a refilled: %s, want [b:1]", got)
	}
	for range 4 {
		tick(tr, c)
	}
	if got := near(); got != "[b:1]" {
		t.Errorf("in the fifth interval after b's decision: %s, want [b:1]", got)
	}
	tick(tr, c) // b's interval leaves the minute (Minute: the current interval and the five before)
	if got := near(); got != "[]" {
		t.Errorf("in the sixth interval after b's decision: %s, want []", got)
	}
}
