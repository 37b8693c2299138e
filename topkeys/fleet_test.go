package topkeys

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/driplimit/drip/engine"
)

// TestMerge: three instances with skewed streams of their own, summaries
// encoded as they are put on the board and merged, hold the fleet's
// exact counts to the error bounds the merge states, over each window;
// a key near its limit on two instances is listed once, with the least
// left.
func TestMerge(t *testing.T) {
	exact := map[string]uint64{}
	exactDen := map[string]uint64{}
	var parts []Summary
	for inst := range 3 {
		tr, c := newTracker()
		next := zipf(uint64(inst+1), 1.1, 50_000)
		for range 4 {
			for range 5000 {
				k := fmt.Sprintf("k%d", next())
				ev := engine.Allowed
				if len(k)%2 == 0 {
					ev = engine.Denied
					exactDen[k]++
				}
				exact[k]++
				decide(tr, "r", k, ev, 8, 10)
			}
			tick(tr, c)
		}
		decide(tr, "r", "near", engine.Allowed, float64(inst+1), 10)
		exact["near"]++
		b, ok := tr.Encode(1 << 20)
		if !ok {
			t.Fatal("a summary does not fit in 1 MiB")
		}
		var s Summary
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		parts = append(parts, s)
	}
	for _, w := range []string{Minute, FiveMinutes, Hour} {
		var ws [][]Window
		for _, p := range parts {
			ws = append(ws, p.Windows[w])
		}
		m := Merge(Capacity, ws...)
		if len(m) != 1 || m[0].Rule != "r" || m[0].Requests != 60_003 {
			t.Fatalf("%s: %d rules, %+v", w, len(m), m)
		}
		checkCounts(t, w+" requests", m[0].TopRequests, m[0].RequestsBound, exact)
		checkCounts(t, w+" denials", m[0].TopDenied, m[0].DenialsBound, exactDen)
		if len(m[0].Near) != 1 || m[0].Near[0].Key != "near" || m[0].Near[0].Tokens != 1 {
			t.Errorf("%s: near %+v, want near once with 1 token left", w, m[0].Near)
		}
	}
}

// TestEncodeBounded: a summary of many rules with long keys is shortened
// to fit the size it is given, its bounds raised so that the counts stay
// true, and still parses.
func TestEncodeBounded(t *testing.T) {
	tr, _ := newTracker()
	exact := map[string]uint64{}
	for r := range 50 {
		for k := range 200 {
			key := fmt.Sprintf("%0200d", k)
			for range k%7 + 1 {
				decide(tr, fmt.Sprint("rule", r), key, engine.Allowed, 8, 10)
				if r == 0 {
					exact[key]++
				}
			}
		}
	}
	full, _ := tr.Encode(1 << 30)
	for _, limit := range []int{len(full) / 3, 20_000, 2_000} {
		b, ok := tr.Encode(limit)
		if !ok || len(b) > limit {
			t.Fatalf("limit %d: %d bytes, %v", limit, len(b), ok)
		}
		var s Summary
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		for _, w := range s.Windows[Minute] {
			if w.Rule == "rule0" {
				checkCounts(t, fmt.Sprint("limit ", limit), w.TopRequests, w.RequestsBound, exact)
			}
		}
	}
	if _, ok := tr.Encode(10); ok {
		t.Error("10 bytes: a summary fits")
	}
}
