package simulate

import (
	"strings"
	"testing"
	"time"
)

func TestParsePattern(t *testing.T) {
	for _, c := range []struct {
		in       string
		canon    string
		n        int
		duration time.Duration
	}{
		{"60/s for 10s", "60/s for 10s", 600, 10 * time.Second},
		{"60rps for 10s", "60/s for 10s", 600, 10 * time.Second},
		{" 60 / S  FOR 10s ", "60/s for 10s", 600, 10 * time.Second},
		{"300/m for 2m", "300/m for 2m0s", 600, 2 * time.Minute},
		{"5/100ms for 2s", "5/100ms for 2s", 100, 2 * time.Second},
		{"1/3s for 10s", "1/3s for 10s", 4, 10 * time.Second}, // at 0, 3, 6, 9
		{"0.5/s for 3s", "0.5/s for 3s", 2, 3 * time.Second},
		{"idle 5s", "idle 5s", 0, 5 * time.Second},
		{"100 at once", "100 at once", 100, 0},
		{"60/s for 10s, idle 5s, 100 at once, 10/s for 5s", "60/s for 10s, idle 5s, 100 at once, 10/s for 5s", 750, 20 * time.Second},
	} {
		p, err := ParsePattern(c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if p.String() != c.canon || p.Len() != c.n || p.Duration() != c.duration || len(p.Arrivals(Arrival{})) != c.n {
			t.Errorf("%q: %q, %d requests over %v; want %q, %d, %v", c.in, p, p.Len(), p.Duration(), c.canon, c.n, c.duration)
		}
		if q, err := ParsePattern(p.String()); err != nil || q.String() != p.String() {
			t.Errorf("%q does not read back: %v", p, err)
		}
	}
}

func TestParsePatternErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", `phase 1 "": empty`},
		{"60/s", "want \"60/s for 10s\""},
		{"60/s for 0s", `duration "0s" must be`},
		{"60/s for ten", `duration "ten"`},
		{"0/s for 1s", `rate "0" must be`},
		{"60/fortnight for 1s", `unit "fortnight"`},
		{"idle", "want"},
		{"0 at once", `count "0"`},
		{"10/s for 1s, bogus, idle -1s", `phase 2 "bogus"`},
		{"10/s for 1s, bogus, idle -1s", `phase 3 "idle -1s"`},
		{"100000/ms for 1h", "more than"},
	} {
		_, err := ParsePattern(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want it to mention %q", c.in, err, c.want)
		}
	}
}

func TestPatternArrivals(t *testing.T) {
	p, err := ParsePattern("3/s for 1s, idle 1s, 2 at once, 2/s for 1s")
	if err != nil {
		t.Fatal(err)
	}
	var got []time.Duration
	for _, e := range p.Arrivals(Arrival{Key: "k", Cost: 2, Reserve: true}) {
		if e.Key != "k" || e.Cost != 2 || !e.Reserve {
			t.Fatalf("event %+v does not copy the template", e)
		}
		got = append(got, e.At)
	}
	ms := time.Millisecond
	want := []time.Duration{0, 333333333, 666666667, 2000 * ms, 2000 * ms, 2000 * ms, 2500 * ms}
	if len(got) != len(want) {
		t.Fatalf("times %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("times %v, want %v", got, want)
		}
	}
}
