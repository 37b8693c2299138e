package rules

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/memstore"
)

// TestSlidingWindowRule: a sliding_window rule is its rate per period,
// with the burst the rate and the slots as written (10 when not).
func TestSlidingWindowRule(t *testing.T) {
	set, err := Parse([]byte(`{"rules": [
		{"name": "a", "limit_keys": ["global"], "algorithm": "sliding_window",
		 "algorithm_config": {"rate": 100, "period": "1m", "slots": 20}},
		{"name": "b", "limit_keys": ["global"], "algorithm": "sliding_window",
		 "algorithm_config": {"rps": 5}}
	]}`), "windows.json")
	if err != nil {
		t.Fatal(err)
	}
	want := []drip.Limit{
		{Algorithm: drip.SlidingWindow, Rate: 100, Period: time.Minute, Burst: 100, Slots: 20},
		{Algorithm: drip.SlidingWindow, Rate: 5, Period: time.Second, Burst: 5},
	}
	for i, w := range want {
		if got := set.Rules[i].Limit; got != w {
			t.Errorf("rule %d: limit %+v, want %+v", i, got, w)
		}
		p, err := set.Rules[i].Limit.Params("k")
		if err != nil {
			t.Fatal(err)
		}
		if slots := max(w.Slots, 10); p.Parts != int64(slots) {
			t.Errorf("rule %d: %d slots, want %d", i, p.Parts, slots)
		}
	}
}

// TestCalendarRule: "period": "day" | "week" | "month" on a fixed window
// is a calendar window in its time zone (UTC without one).
func TestCalendarRule(t *testing.T) {
	set, err := Parse([]byte(`{"rules": [
		{"name": "a", "limit_keys": ["global"], "algorithm": "fixed_window",
		 "algorithm_config": {"rate": 10000, "period": "month", "time_zone": "Europe/Berlin"}},
		{"name": "b", "limit_keys": ["global"], "algorithm": "fixed_window",
		 "algorithm_config": {"rate": 5, "period": "week"}}
	]}`), "calendar.json")
	if err != nil {
		t.Fatal(err)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	a, b := set.Rules[0].Limit, set.Rules[1].Limit
	if a.Algorithm != drip.FixedWindow || a.Calendar != "month" || a.Location.String() != berlin.String() || a.Rate != 10000 || a.Period != 0 {
		t.Errorf("rule a: %+v", a)
	}
	if b.Calendar != "week" || b.Location != nil || b.Rate != 5 {
		t.Errorf("rule b: %+v", b)
	}
	// A take on 2026-03-30 (after Berlin's change to summer time) is in
	// March in Berlin, which ends on 31 March at 22:00 UTC (midnight CEST).
	st := memstore.New(memstore.WithSweep(0))
	at := time.Date(2026, 3, 30, 12, 0, 0, 0, time.UTC)
	d, err := drip.New(st, a, drip.WithClock(func() time.Time { return at })).Take(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if want := 34 * time.Hour; !d.Allowed || d.ResetAfter != want || d.Remaining != 9999 {
		t.Errorf("take: %+v, want allowed, 9999 left and a reset after %v", d, want)
	}
}

// TestWindowClaims: a claimed rate is a sliding window's whole limit (its
// burst follows), and a burst_claim is refused with its path.
func TestWindowClaims(t *testing.T) {
	set, err := Parse([]byte(`{"jwt": {"verify": false}, "rules": [
		{"name": "a", "limit_keys": ["global"], "algorithm": "sliding_window",
		 "algorithm_config": {"rate": 10, "period": "1m"},
		 "limit_from_claims": {"rate_claim": "rpm", "max_rate": 100}}
	]}`), "claims.json")
	if err != nil {
		t.Fatal(err)
	}
	l, ok := set.Rules[0].LimitFor(func(s Source) (string, bool) { return "50", s.Name == "rpm" })
	if !ok || l.Rate != 50 || l.Burst != 50 || l.Validate() != nil {
		t.Errorf("claimed limit %+v (%v), want 50 per minute", l, ok)
	}
	_, err = Parse([]byte(`{"jwt": {"verify": false}, "rules": [
		{"name": "a", "limit_keys": ["global"], "algorithm": "fixed_window",
		 "algorithm_config": {"rate": 10, "period": "day"},
		 "limit_from_claims": {"burst_claim": "b", "max_burst": 100}}
	]}`), "claims.json")
	if err == nil || !strings.Contains(err.Error(), "rules[0].limit_from_claims.burst_claim: a sliding or calendar window has no burst apart from its rate") {
		t.Errorf("a burst_claim on a calendar window: err = %v", err)
	}
}

// TestCalendarZoneNames: a rules file's time_zone is a name of the time
// zone database: path tricks, the machine's own zone files and long names
// are refused with the rule's path, before any file is read.
func TestCalendarZoneNames(t *testing.T) {
	for _, zone := range []string{"./Europe/Berlin", "Europe//Berlin", "../../etc/passwd", "/etc/localtime", "localtime", "Local", "posixrules", "right/UTC", "", strings.Repeat("A/", 100) + "B"} {
		_, err := Parse([]byte(`{"rules": [{"name": "a", "limit_keys": ["global"], "algorithm": "fixed_window",
		 "algorithm_config": {"rate": 5, "period": "day", "time_zone": "`+zone+`"}}]}`), "zones.json")
		if err == nil || !strings.Contains(err.Error(), "rules[0].algorithm_config.time_zone: must name a time zone of the time zone database") {
			t.Errorf("time_zone %.40q: %v", zone, err)
		}
	}
}
