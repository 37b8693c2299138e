package bucket

import (
	"math"
	"testing"
	"time"
)

// FuzzEval checks the math's invariants on arbitrary buckets, limits and
// requests: tokens never exceed the burst, a denial or a peek writes
// nothing, ts never moves backwards, an allowed take removes exactly its
// cost, and after RetryAfter the same take is allowed.
func FuzzEval(f *testing.F) {
	f.Add(uint8(0), int64(5e6), int64(1e9), int64(10e6), int64(1e6), int64(3e6), int64(123), int64(1e9), false, true, int64(-1))
	f.Add(uint8(1), int64(5e6), int64(10e9), int64(20e6), int64(18e6), int64(2e6), int64(15e9), int64(20e9), false, true, int64(-1))
	f.Add(uint8(2), int64(3e6), int64(60e9), int64(5e6), int64(4e6), int64(-7e6), int64(9e9), int64(1e9), true, true, int64(3e6))
	f.Fuzz(func(t *testing.T, kind uint8, rate, period, burst, cost, tokens, ts, now int64, reserve, found bool, maxRes int64) {
		p := Params{Kind: Kind(kind % 3), Rate: clamp(rate, 1, 1e18), Period: clamp(period, 1, 1e15), Burst: clamp(burst, 1, 1e18), MaxReserved: -1}
		if maxRes >= 0 {
			p.MaxReserved = clamp(maxRes, 0, 1e18)
		}
		p.Start = floorMod(ts, p.Period)
		cost = clamp(cost, 0, p.Burst)
		if reserve {
			cost = clamp(cost, 0, 2*p.Burst)
		}
		b := State{Tokens: clamp(tokens, -p.Burst, p.Burst), TS: clamp(ts, -1e18, 1e18)}
		now = clamp(now, -1e18, 1e18)
		for _, op := range []Op{Take, Peek, Refund} {
			d, n, write := Eval(op, b, found, p, cost, reserve, now)
			if n.Tokens > p.Burst {
				t.Fatalf("%v: tokens %d over burst %d", op, n.Tokens, p.Burst)
			}
			if d.RetryAfter < 0 || d.ResetAfter < 0 {
				t.Fatalf("%v: negative time %+v", op, d)
			}
			if op == Peek && write {
				t.Fatal("peek writes")
			}
			if !d.Allowed && write {
				t.Fatalf("%v: denial writes", op)
			}
			if found && now < b.TS && n.TS < b.TS && now < p.ExpiresAt(b) {
				t.Fatalf("%v: ts moved backwards from %d to %d", op, b.TS, n.TS)
			}
			if n.TS > max(now, b.TS) && found {
				t.Fatalf("%v: ts %d beyond now %d and old ts %d", op, n.TS, now, b.TS)
			}
			if op != Take {
				continue
			}
			a := p.Refilled(b, now)
			if !found || now >= p.ExpiresAt(b) {
				a = p.Fresh(now)
			}
			if d.Allowed && n.Tokens != a.Tokens-cost {
				t.Fatalf("allowed take of %d: %d -> %d", cost, a.Tokens, n.Tokens)
			}
			if !d.Allowed && d.RetryAfter < time.Duration(math.MaxInt64/2) {
				// Waiting RetryAfter makes the same take succeed.
				later := now + int64(d.RetryAfter)
				if d2, _, _ := Eval(Take, b, found, p, cost, reserve, later); !d2.Allowed && later >= now {
					t.Fatalf("denied with retry %v, and still denied then: %+v", d.RetryAfter, d2)
				}
				// And not earlier than needed: continuous refill keeps its
				// remainder to under a nanosecond, so the answer may be
				// late by at most that, rounded up (the grid answers are
				// checked exactly by storetest's scenarios).
				if d.RetryAfter > 2 && p.Kind == Continuous {
					if d3, _, _ := Eval(Take, b, found, p, cost, reserve, later-2); d3.Allowed {
						t.Fatalf("retry %v is later than needed", d.RetryAfter)
					}
				}
			}
		}
	})
}

func clamp(x, lo, hi int64) int64 { return min(max(x, lo), hi) }

// TestNoDrift takes a token at every refill of an inexact rate (7 per 3
// seconds) for a simulated day: the bucket must never be short of what
// exact arithmetic gives by more than the documented tolerance.
func TestNoDrift(t *testing.T) {
	p := Params{Kind: Continuous, Rate: 7 * Micro, Period: 3e9, Burst: 7 * Micro, MaxReserved: -1}
	b := p.Fresh(0)
	var granted int64
	// One request every 100 ms for 24 h: 864,000 decisions.
	for now := int64(0); now < 24*3600e9; now += 1e8 {
		d, n, w := Eval(Take, b, true, p, Micro, false, now)
		if w {
			b = n
		}
		if d.Allowed {
			granted++
		}
	}
	// Exact: burst 7 plus 7/3 per second for 86,400 s = 201,607 (the last
	// refill lands just before the end).
	exact := int64(7 + 7*86400/3)
	if granted < exact-1 || granted > exact {
		t.Fatalf("granted %d tokens in a day, exact arithmetic gives %d", granted, exact)
	}
}

func TestBoundaryIsExact(t *testing.T) {
	p := Params{Kind: Continuous, Rate: 10 * Micro, Period: 1e9, Burst: 10 * Micro, MaxReserved: -1}
	b := State{Tokens: 0, TS: 5e9}
	d, _, _ := Eval(Take, b, true, p, Micro, false, 5e9+1e8)
	if !d.Allowed {
		t.Fatalf("0.1 s after emptying at 10/s a take of 1 must be allowed: %+v", d)
	}
	d, _, _ = Eval(Take, b, true, p, Micro, false, 5e9+1e8-1)
	if d.Allowed || d.RetryAfter != 1 {
		t.Fatalf("one nanosecond earlier it must be denied with retry 1ns: %+v", d)
	}
}

// TestBeforeEpoch: times before 1970 are ordinary times (a caller-supplied
// clock may start anywhere): a bucket refills and expires as at any other.
func TestBeforeEpoch(t *testing.T) {
	p := Params{Kind: Continuous, Rate: 10 * Micro, Period: 1e9, Burst: 10 * Micro, MaxReserved: -1}
	b := State{Tokens: 0, TS: -10e9}
	if got := p.ExpiresAt(b); got != -9e9 {
		t.Fatalf("ExpiresAt = %d, want -9e9", got)
	}
	if got := p.Until(b, p.Burst, -9.5e9); got != 500*time.Millisecond {
		t.Fatalf("Until = %v, want 500ms", got)
	}
	if d, _, _ := Eval(Peek, b, true, p, 10*Micro, false, -8e9); !d.Allowed {
		t.Fatalf("a full bucket after -9 s: %+v", d)
	}
}

// FuzzAdmit checks that Admit decides a take as Eval does, and leaves the
// same state when it allows.
func FuzzAdmit(f *testing.F) {
	f.Add(uint8(0), int64(5e6), int64(1e9), int64(10e6), int64(1e6), int64(3e6), int64(123), int64(1e9), true)
	f.Add(uint8(0), int64(100e6), int64(1e9), int64(100e6), int64(1e6), int64(99e6), int64(5e9), int64(5e9+10), true)
	f.Add(uint8(0), int64(100e6), int64(1e9), int64(100e6), int64(1e6), int64(0), int64(5e9), int64(5e9+10_000_000), true)
	f.Add(uint8(1), int64(5e6), int64(10e9), int64(20e6), int64(18e6), int64(2e6), int64(15e9), int64(20e9), true)
	f.Add(uint8(2), int64(3e6), int64(60e9), int64(5e6), int64(4e6), int64(-7e6), int64(9e9), int64(1e9), false)
	f.Fuzz(func(t *testing.T, kind uint8, rate, period, burst, cost, tokens, ts, now int64, found bool) {
		p := Params{Kind: Kind(kind % 3), Rate: clamp(rate, 1, 1e18), Period: clamp(period, 1, 1e15), Burst: clamp(burst, 1, 1e18), MaxReserved: -1}
		p.Start = floorMod(ts, p.Period)
		cost = clamp(cost, 0, p.Burst)
		b := State{Tokens: clamp(tokens, -p.Burst, p.Burst), TS: clamp(ts, -1e18, 1e18)}
		now = clamp(now, -1e18, 1e18)
		d, n, write := Eval(Take, b, found, p, cost, false, now)
		ok, m := Admit(b, found, p, cost, now)
		if ok != d.Allowed || ok != write {
			t.Fatalf("Admit %v, Eval %+v (write %v)", ok, d, write)
		}
		if ok && m != n {
			t.Fatalf("Admit leaves %+v, Eval %+v", m, n)
		}
	})
}
