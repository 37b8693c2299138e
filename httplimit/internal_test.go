package httplimit

import (
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/driplimit/drip"
)

func TestBreaker(t *testing.T) {
	b := newBreaker()
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		ok, probe, _ := b.allow(t0)
		if !ok || probe {
			t.Fatalf("closed call %d: %v %v", i, ok, probe)
		}
		if ch := b.failure(t0, 3, time.Second, false); (ch == BreakerOpen) != (i == 2) {
			t.Fatalf("failure %d: %q", i, ch)
		}
	}
	if ok, _, _ := b.allow(t0.Add(999 * time.Millisecond)); ok {
		t.Fatal("open breaker let a call through during the cool-down")
	}
	ok, probe, ch := b.allow(t0.Add(time.Second))
	if !ok || !probe || ch != BreakerHalfOpen {
		t.Fatalf("after the cool-down: %v %v %q", ok, probe, ch)
	}
	if ok, _, _ := b.allow(t0.Add(time.Second)); ok {
		t.Fatal("a second call went through while the probe was in flight")
	}
	if ch := b.success(true); ch != BreakerClosed || b.State() != BreakerClosed {
		t.Fatalf("probe success: %q %s", ch, b.State())
	}
	// A success resets the count of consecutive failures.
	b.failure(t0, 3, time.Second, false)
	b.failure(t0, 3, time.Second, false)
	b.success(false)
	if ch := b.failure(t0, 3, time.Second, false); ch != "" {
		t.Fatalf("failures were not consecutive, yet %q", ch)
	}
}

func TestUntake(t *testing.T) {
	// Continuous, 10/s burst 20: 5 left after taking 2 means 7 before,
	// full in 1.3 s rather than 1.5 s.
	d := drip.Decision{Allowed: true, Tokens: 5, Remaining: 5, Limit: 20, ResetAfter: 1500 * time.Millisecond}
	got := untake(d, drip.PerSecond(10).WithBurst(20), 2)
	if got.Tokens != 7 || got.Remaining != 7 || got.ResetAfter != 1300*time.Millisecond {
		t.Errorf("continuous: %+v", got)
	}
	// Interval, 5 per 10 s burst 20: 9 left after taking 2 (11 before);
	// full after 3 periods from 9, 2 from 11.
	got = untake(drip.Decision{Allowed: true, Tokens: 9, Remaining: 9, ResetAfter: 27 * time.Second},
		drip.Every(5, 10*time.Second).WithBurst(20).WithRefill(drip.Interval), 2)
	if got.Tokens != 11 || got.Remaining != 11 || got.ResetAfter != 17*time.Second {
		t.Errorf("interval: %+v", got)
	}
	// Cost 0 changes nothing.
	if got := untake(d, drip.PerSecond(10).WithBurst(20), 0); got != d {
		t.Errorf("cost 0: %+v", got)
	}
}

func TestFillSeconds(t *testing.T) {
	for _, c := range []struct {
		l    drip.Limit
		want int64
	}{
		{drip.PerSecond(10).WithBurst(20), 2},
		{drip.PerSecond(3).WithBurst(10), 4},
		{drip.Every(100, time.Minute), 60},
		{drip.Every(5, 10*time.Second).WithBurst(12).WithRefill(drip.Interval), 30},
		{drip.Every(3, 10*time.Second).Window(), 10},
		{drip.PerSecond(0.1).WithBurst(1), 10},
	} {
		if got := drip.CeilSeconds(c.l.FillTime()); got != c.want {
			t.Errorf("CeilSeconds(%v.FillTime()) = %d, want %d", c.l, got, c.want)
		}
	}
	if got := policyItem("a", drip.PerSecond(2).WithBurst(2.5)); got != `"a";q=2.5;w=2` {
		t.Errorf("policyItem = %s", got)
	}
}

func TestTokenCacheBounded(t *testing.T) {
	var c tokenCache
	for i := range 3 * tokenCacheSize {
		var h [32]byte
		h[0], h[1] = byte(i), byte(i>>8)
		c.put(h, jwt.MapClaims{})
	}
	if n := len(c.m); n > tokenCacheSize || n < tokenCacheSize/2 {
		t.Errorf("%d entries", n)
	}
}

func TestClaimText(t *testing.T) {
	for v, want := range map[any]string{"x": "x", true: "true", 2.5: "2.5"} {
		if got, ok := claimText(v); !ok || got != want {
			t.Errorf("claimText(%v) = %q", v, got)
		}
	}
	if _, ok := claimText([]any{"a"}); ok {
		t.Error("a list has a text")
	}
}
