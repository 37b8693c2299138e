package simulate

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip"
)

// burst50 is the limit of docs/commands.md's worked example: r = 10 tokens per
// second, b = 50.
var burst50 = drip.PerSecond(10).WithBurst(50)

func run(t *testing.T, pattern string, l drip.Limit, tmpl Arrival, keep int) *Report {
	t.Helper()
	p, err := ParsePattern(pattern)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), p.Arrivals(tmpl), Options{Limit: l, End: p.Duration(), Keep: keep})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func secondsAt(n, rps int) time.Duration {
	return time.Duration(math.Round(float64(n) * 1e9 / float64(rps)))
}

// A steady overload of 60/s against 10/s burst 50, from a full bucket:
// request k (from 0) is sent at k/60 s and finds 50 + 10k/60 - k tokens,
// so requests 0..58 pass (59 in the first second: the burst plus the
// refill while it is spent), request 59 (the 60th, at 59/60 s) finds 0.83
// and is denied. From t = 1 s the bucket is empty and every sixth request
// (at each tenth of a second) passes: exactly rate accepted per second.
// TestSteadyOverloadOddLength: a run that does not end on a whole row
// still reports the steady rate of its traffic, not of a padded tail.
func TestSteadyOverloadOddLength(t *testing.T) {
	res := run(t, "60/s for 61s", burst50, Arrival{Cost: 1}, 0)
	if res.Total.To != 61*time.Second {
		t.Errorf("total over %v, want 61s", res.Total.To)
	}
	if s := res.Steady; s.AcceptedPerSecond() != 10 {
		t.Errorf("steady = %+v (%v/s), want exactly 10/s", s, s.AcceptedPerSecond())
	}
}

func TestSteadyOverload(t *testing.T) {
	res := run(t, "60/s for 10s", burst50, Arrival{Cost: 1}, 0)
	if res.Total.Sent != 600 || res.Total.Accepted != 59+9*10 || res.Total.Denied != 600-149 {
		t.Errorf("total = %+v, want 600 sent, 149 accepted, 451 denied", res.Total)
	}
	if len(res.Rows) != 10 {
		t.Fatalf("%d rows, want 10", len(res.Rows))
	}
	if r := res.Rows[0]; r.Accepted != 59 || r.Denied != 1 {
		t.Errorf("first second: %+v, want 59 accepted, 1 denied", r)
	}
	for _, r := range res.Rows[1:] {
		if r.Sent != 60 || r.Accepted != 10 {
			t.Errorf("second %v: %+v, want 60 sent, exactly 10 accepted", r.From, r)
		}
		// The row ends just before a request that finds exactly 1 token.
		if r.Tokens != 1 {
			t.Errorf("second %v: tokens at end %v, want 1", r.From, r.Tokens)
		}
	}
	if s := res.Steady; s.From != 5*time.Second || s.Sent != 300 || s.Accepted != 50 || s.AcceptedPerSecond() != 10 {
		t.Errorf("steady = %+v, want 50 of 300 accepted from 5s, 10/s", s)
	}
	d := res.FirstDenial
	if d == nil || d.N != 60 || d.Arrival.At != secondsAt(59, 60) {
		t.Fatalf("first denial = %+v, want request 60 at 59/60 s", d)
	}
	// 50 + 10*59/60 - 59 = 0.8333 tokens: 1/60 s until 1 token.
	if math.Abs(d.Decision.Tokens-5.0/6) > 1e-6 || !near(d.Decision.RetryAfter, time.Second/60) {
		t.Errorf("first denial: tokens %v retry %v, want 0.8333 and 1/60 s", d.Decision.Tokens, d.Decision.RetryAfter)
	}
	// The longest wait: just after a request takes the last token at
	// t = 1.0 s, the next finds 1/6 token and waits 0.0833 s.
	if r := res.LongestRetry; r == nil || r.N != 62 || !near(r.Decision.RetryAfter, time.Second/12) {
		t.Errorf("longest retry = %+v, want request 62 waiting 1/12 s", r)
	}
	if res.Reserved != 0 || res.LongestDelay != nil {
		t.Errorf("reserved %d, %+v without reserve", res.Reserved, res.LongestDelay)
	}
}

func near(d, want time.Duration) bool { return (d - want).Abs() <= time.Microsecond }

// The worked example: r = 10, b = 50, a full bucket, 60 requests per
// second from t = 0, with the bucket never refilled during the first
// second (50 accepted, the 51st denied with Retry-After: 1, then 1 in 6
// accepted): that is an interval refill, which adds the
// second's 10 tokens at t = 1 s. With drip's default continuous refill the
// tokens that drip in while the burst is spent let 9 more through (see
// TestSteadyOverload); the steady state is the same.
func TestWorkedExampleInterval(t *testing.T) {
	res := run(t, "60/s for 10s", burst50.WithRefill(drip.Interval), Arrival{Cost: 1}, 60)
	for i, o := range res.First[:50] {
		if !o.Decision.Allowed || o.Decision.Tokens != float64(49-i) {
			t.Errorf("request %d: %+v, want accepted with %d tokens after", i+1, o.Decision, 49-i)
		}
	}
	d := res.FirstDenial
	if d == nil || d.N != 51 || d.Arrival.At != secondsAt(50, 60) {
		t.Fatalf("first denial = %+v, want the 51st request, at 50/60 s", d)
	}
	if d.Decision.Tokens != 0 || header(d.Decision.RetryAfter) != 1 || !near(d.Decision.RetryAfter, time.Second/6) {
		t.Errorf("first denial: tokens %v, retry %v, want 0 and 1/6 s (Retry-After: 1)", d.Decision.Tokens, d.Decision.RetryAfter)
	}
	if r := res.Rows[0]; r.Accepted != 50 || r.Denied != 10 {
		t.Errorf("first second: %+v, want the 50 of the burst", r)
	}
	for _, r := range res.Rows[1:] {
		if r.Accepted != 10 || r.Denied != 50 {
			t.Errorf("second %v: %+v, want 10 accepted, 50 denied", r.From, r)
		}
	}
	// Stable state: 10/60 of requests succeed, 10/s.
	if s := res.Steady; s.Accepted*6 != s.Sent || s.AcceptedPerSecond() != 10 {
		t.Errorf("steady state %+v, want 1 in 6 accepted, 10/s", s)
	}
}

// "If the client stops sending for 5 seconds, the bucket refills to
// min(50, 0 + 5 × 10) = 50. The next burst can spend all 50 again."
func TestIdleGapRefillsToBurst(t *testing.T) {
	for _, refill := range []drip.Refill{drip.Continuous, drip.Interval} {
		t.Run(string(refill), func(t *testing.T) {
			l := burst50.WithRefill(refill)
			res := run(t, "60/s for 10s, idle 5s, 60/s for 1s", l, Arrival{Cost: 1}, 0)
			if len(res.Rows) != 16 {
				t.Fatalf("%d rows, want 16", len(res.Rows))
			}
			if got := res.Rows[14].Tokens; got != 50 {
				t.Errorf("tokens at 15s, after the gap: %v, want 50", got)
			}
			if got, want := res.Rows[15].Accepted, res.Rows[0].Accepted; got != want {
				t.Errorf("the burst after the gap passed %d, want %d as at the start", got, want)
			}
			for _, r := range res.Rows[10:15] {
				if r.Sent != 0 {
					t.Errorf("idle second %v sent %d", r.From, r.Sent)
				}
			}
		})
	}
	// A gap too short to fill: the last token is taken at 9.9 s, so at the
	// end of a 3 s gap (13 s) the bucket holds 0 + 3.1 * 10 = 31.
	res := run(t, "60/s for 10s, idle 3s", burst50, Arrival{Cost: 1}, 0)
	if got := res.Rows[12].Tokens; math.Abs(got-31) > 1e-6 {
		t.Errorf("tokens at 13s: %v, want 31", got)
	}
}

// A fixed window of 10 per second on the whole-second grid passes the
// first 10 requests of each window.
func TestFixedWindow(t *testing.T) {
	l := drip.Limit{Algorithm: drip.FixedWindow, Rate: 10, Period: time.Second, Start: time.Second}
	res := run(t, "60/s for 3s", l, Arrival{Cost: 1}, 0)
	for _, r := range res.Rows {
		if r.Accepted != 10 || r.Denied != 50 {
			t.Errorf("window %v: %+v, want 10 accepted", r.From, r)
		}
	}
	// The steady state is cut to whole windows: the last one, 2s to 3s.
	if s := res.Steady; s.From != 2*time.Second || s.Accepted != 10 || s.AcceptedPerSecond() != 10 {
		t.Errorf("steady %+v, want the last window, 10 accepted", s)
	}
	if d := res.FirstDenial; d == nil || d.N != 11 || !near(d.Decision.RetryAfter, time.Second-secondsAt(10, 60)) {
		t.Errorf("first denial %+v, want request 11 waiting for the next window", d)
	}
}

func TestCostAndReserve(t *testing.T) {
	// Cost 2 halves the accepted requests in the steady state.
	res := run(t, "60/s for 10s", burst50, Arrival{Cost: 2}, 0)
	if s := res.Steady; s.AcceptedPerSecond() != 5 {
		t.Errorf("cost 2: steady %+v, want 5 accepted/s", s)
	}
	// Reservations within 5 tokens of debt are all accepted, delayed by at
	// most 5 tokens' worth of refill (0.5 s); beyond, they are denied.
	res = run(t, "60/s for 10s", burst50.WithMaxReserved(5), Arrival{Cost: 1, Reserve: true}, 0)
	if res.Reserved == 0 || res.LongestDelay == nil || res.LongestDelay.Decision.RetryAfter > time.Second/2 {
		t.Errorf("reserve: %d reserved, longest %+v, want some, at most 0.5 s", res.Reserved, res.LongestDelay)
	}
	if s := res.Steady; s.AcceptedPerSecond() != 10 {
		t.Errorf("reserve: steady %+v, want 10 accepted/s", s)
	}
	// Cost over burst without reserve is an error, not a run of denials.
	p, _ := ParsePattern("1 at once")
	_, err := Run(context.Background(), p.Arrivals(Arrival{Cost: 51}), Options{Limit: burst50})
	if !errors.Is(err, drip.ErrCostExceedsBurst) {
		t.Errorf("cost 51 > burst 50: err = %v, want ErrCostExceedsBurst", err)
	}
}

// Whatever the traffic, no span of time [a, b] grants more than burst +
// rate * (b - a): checked over every pair of accepted requests.
func TestNeverOverGrants(t *testing.T) {
	for _, pat := range []string{
		"60/s for 5s, idle 2s, 200 at once, 13/s for 4s",
		"9/s for 3s, 100 at once, idle 1s, 100 at once",
		"7/100ms for 3s",
	} {
		for _, l := range []drip.Limit{burst50, burst50.WithRefill(drip.Interval), drip.Per(3, 700*time.Millisecond).WithBurst(4.5)} {
			p, _ := ParsePattern(pat)
			res, err := Run(context.Background(), p.Arrivals(Arrival{Cost: 1}), Options{Limit: l, End: p.Duration(), Keep: p.Len()})
			if err != nil {
				t.Fatal(err)
			}
			var acc []time.Duration
			for _, o := range res.First {
				if o.Decision.Allowed {
					acc = append(acc, o.Arrival.At)
				}
			}
			burst := l.Burst
			perNs := l.Rate / float64(periodOf(l))
			for i := range acc {
				for j := i; j < len(acc); j++ {
					if n := float64(j - i + 1); n > burst+perNs*float64(acc[j]-acc[i])+1e-6 {
						// Interval refills land whole periods at once.
						if l.Refill == drip.Interval && n <= burst+l.Rate*math.Ceil(float64(acc[j]-acc[i])/float64(periodOf(l))) {
							continue
						}
						t.Fatalf("%s, %v: %v granted from %v to %v", pat, l, n, acc[i], acc[j])
					}
				}
			}
		}
	}
}

func TestManyKeys(t *testing.T) {
	var evs []Arrival
	for i := range 30 {
		evs = append(evs, Arrival{At: time.Duration(i) * time.Second / 30, Key: "a", Cost: 1})
		if i%3 == 0 {
			evs = append(evs, Arrival{At: time.Duration(i) * time.Second / 30, Key: "b", Cost: 1})
		}
	}
	res, err := Run(context.Background(), evs, Options{Limit: drip.PerSecond(5)})
	if err != nil {
		t.Fatal(err)
	}
	// a: 30 requests in a second against burst 5 + 5/s; b: 10, the same.
	if res.Keys != 2 || res.ChartKey != "a" {
		t.Errorf("keys %d, chart key %q, want 2 and a", res.Keys, res.ChartKey)
	}
	if res.Total.Sent != 40 {
		t.Errorf("sent %d, want 40", res.Total.Sent)
	}
	for _, s := range res.Tokens {
		if s.Tokens < 0 || s.Tokens > 5 {
			t.Fatalf("chart sample %+v outside [0, 5]", s)
		}
	}
}

// TestRunIsFast: a run decides on the events' own times and never waits
// for the clock. In a synctest bubble the clock moves only while every
// goroutine of the bubble waits on it, so a run that slept (10 s of
// traffic) would show here as time passed.
func TestRunIsFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := ParsePattern("60/s for 10s")
		start := time.Now()
		if _, err := Run(context.Background(), p.Arrivals(Arrival{Cost: 1}), Options{Limit: burst50, End: p.Duration()}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("the run waited %v for the clock", d)
		}
	})
}

func BenchmarkRun(b *testing.B) {
	p, _ := ParsePattern("60/s for 10s")
	evs := p.Arrivals(Arrival{Cost: 1})
	for b.Loop() {
		if _, err := Run(context.Background(), evs, Options{Limit: burst50, End: p.Duration()}); err != nil {
			b.Fatal(err)
		}
	}
}

// The chart's samples are in time order, start full, reach the bottom of
// every sawtooth tooth and end at the end of the run.
func TestTokenSamples(t *testing.T) {
	res := run(t, "60/s for 10s", burst50, Arrival{Cost: 1}, 0)
	s := res.Tokens
	if len(s) < 100 || len(s) > 3*800+3 {
		t.Fatalf("%d samples", len(s))
	}
	if s[0] != (Sample{0, 50}) || s[len(s)-1].At != res.End {
		t.Errorf("samples from %+v to %+v, want from 50 tokens at 0 to the end", s[0], s[len(s)-1])
	}
	zeros := 0
	for i := range s {
		if i > 0 && s[i].At < s[i-1].At {
			t.Fatalf("sample %d at %v before sample %d at %v", i, s[i].At, i-1, s[i-1].At)
		}
		// Drops happen at one instant: the tokens before a take, then after.
		if i > 0 && s[i].At == s[i-1].At && s[i].Tokens > s[i-1].Tokens {
			t.Errorf("a rise at one instant, %+v then %+v", s[i-1], s[i])
		}
		if s[i].Tokens == 0 {
			zeros++
		}
	}
	// From 1 s on, the bucket is emptied ten times a second.
	if zeros < 90 {
		t.Errorf("the bucket is empty in %d samples, want at least 90", zeros)
	}
}

func TestThinner(t *testing.T) {
	th := thinner{step: time.Second}
	for _, s := range []Sample{{0, 5}, {100, 5}, {100, 4}, {200, 4.5}, {300, 4.5}, {300, 3}, {time.Second, 3.5}} {
		th.add(s)
	}
	got := th.done()
	want := []Sample{{0, 5}, {300, 3}, {time.Second, 3.5}}
	if !slices.Equal(got, want) {
		t.Errorf("thinned to %v, want %v", got, want)
	}
}

// TestConcurrencyRefused: a concurrency limit, given as the limit or by a
// trace line, is refused with ErrConcurrency before anything runs, rather
// than failing at the first request for want of a lease.
func TestConcurrencyRefused(t *testing.T) {
	p, err := ParsePattern("10/s for 1s")
	if err != nil {
		t.Fatal(err)
	}
	inflight := drip.InFlight(2, time.Minute)
	if _, err := Run(context.Background(), p.Arrivals(Arrival{Cost: 1}), Options{Limit: inflight, End: p.Duration()}); !errors.Is(err, ErrConcurrency) {
		t.Errorf("limit: %v, want ErrConcurrency", err)
	}
	evs := p.Arrivals(Arrival{Cost: 1})
	evs[3].Key, evs[3].Limit = "other", &inflight
	if _, err := Run(context.Background(), evs, Options{Limit: drip.PerSecond(5), End: p.Duration()}); !errors.Is(err, ErrConcurrency) {
		t.Errorf("a trace line's limit: %v, want ErrConcurrency", err)
	}
}
