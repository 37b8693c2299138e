package rules

import (
	"testing"
	"time"

	"github.com/driplimit/drip"
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
