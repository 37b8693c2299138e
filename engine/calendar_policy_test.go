package engine_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// TestCalendarPolicyWindow: a calendar window's RateLimit-Policy gives
// the length of the window the decision fell in (w), not that of the
// window the rules were compiled in: a day in Berlin is 23 hours when
// the clocks go forward and 25 when they go back, February has 28 days
// and March 31.
func TestCalendarPolicyWindow(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
	  {"name": "day", "limit_keys": ["header:x-k"], "algorithm": "fixed_window", "algorithm_config": {"rate": 10, "period": "day", "time_zone": "Europe/Berlin"}},
	  {"name": "month", "limit_keys": ["header:x-k"], "algorithm": "fixed_window", "algorithm_config": {"rate": 1000, "period": "month", "time_zone": "Europe/Berlin"}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	var at time.Time
	st := memstore.New()
	defer st.Close()
	e := engine.New(st, engine.WithClock(func() time.Time { return at }))
	defer e.Close()
	rs := e.Compile(set)
	for _, c := range []struct {
		at         time.Time
		day, month int64 // hours
	}{
		{time.Date(2026, 3, 29, 12, 0, 0, 0, berlin), 23, 31*24 - 1},
		{time.Date(2026, 10, 25, 12, 0, 0, 0, berlin), 25, 31*24 + 1},
		{time.Date(2027, 2, 10, 12, 0, 0, 0, berlin), 24, 28 * 24},
		{time.Date(2026, 6, 10, 12, 0, 0, 0, berlin), 24, 30 * 24},
	} {
		at = c.at
		out := e.Decide(context.Background(), rs, values{"header:x-k": c.at.Format(time.DateOnly)})
		if !out.Allowed {
			t.Fatalf("%s: denied: %s", c.at, out.Reason)
		}
		var policy string
		for k, v := range out.Fields().All() {
			if k == "RateLimit-Policy" {
				policy = v
			}
		}
		for name, h := range map[string]int64{"day": c.day, "month": c.month} {
			want := `"` + name + `";q=` + map[string]string{"day": "10", "month": "1000"}[name] + ";w=" + strconv.FormatInt(h*3600, 10)
			if !strings.Contains(policy, want) {
				t.Errorf("%s: RateLimit-Policy %q, want an item %s", c.at, policy, want)
			}
		}
	}
}
