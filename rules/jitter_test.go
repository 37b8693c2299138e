package rules

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

func TestRetryAfterJitterField(t *testing.T) {
	const rule = `"rules": [{"name": "r", "limit_keys": ["global"], "algorithm_config": {"rps": 1}}]`
	s, err := Parse([]byte(`{`+rule+`}`), "default.json")
	if err != nil {
		t.Fatal(err)
	}
	if s.RetryJitter != DefaultJitter || s.RetryJitter != (Jitter{Fraction: 0.5, Max: time.Minute}) {
		t.Errorf("default %+v", s.RetryJitter)
	}
	for src, want := range map[string]Jitter{
		`{"fraction": 0.2, "max": "5s"}`: {Fraction: 0.2, Max: 5 * time.Second},
		`{"max": 10}`:                    {Fraction: 0.5, Max: 10 * time.Second},
		`{"fraction": 0}`:                {Fraction: 0, Max: time.Minute},
		`{"fraction": 1, "max": "0s"}`:   {Fraction: 1},
	} {
		s, err := Parse([]byte(`{"retry_after_jitter": `+src+`, `+rule+`}`), "j.json")
		if err != nil {
			t.Errorf("%s: %v", src, err)
			continue
		}
		if s.RetryJitter != want {
			t.Errorf("%s: %+v, want %+v", src, s.RetryJitter, want)
		}
	}
	for src, msg := range map[string]string{
		`{"fraction": 1.5}`:  "retry_after_jitter.fraction: must be >= 0 and <= 1",
		`{"fraction": -0.1}`: "retry_after_jitter.fraction: must be >= 0 and <= 1",
		`{"max": "-1s"}`:     "retry_after_jitter.max: must be >= 0",
		`{"max": "soon"}`:    "retry_after_jitter.max: must be a duration",
		`{"jitter": 1}`:      "jitter",
		`0.5`:                "retry_after_jitter",
	} {
		_, err := Parse([]byte(`{"retry_after_jitter": `+src+`, `+rule+`}`), "j.json")
		if err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: err %v, want %q", src, err, msg)
		}
	}
}

func TestEverythingRetryJitter(t *testing.T) {
	s, err := Load("testdata/good/everything.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s.RetryJitter != (Jitter{Fraction: 0.25, Max: 30 * time.Second}) {
		t.Errorf("retry_after_jitter %+v", s.RetryJitter)
	}
}

// TestRetryJitterCap: the jitter of a long wait is capped in absolute
// terms (a one-day wait gets at most 60 s more, not 12 hours), still
// spreads clients and stays fixed per identity; short waits keep their
// full 50%.
func TestRetryJitterCap(t *testing.T) {
	day := 24 * time.Hour
	j := DefaultJitter
	values := map[int64]int{}
	for i := range 500 {
		id := fmt.Sprint("client-", i)
		v := j.Seconds(id, day)
		if v < 86400 || v > 86400+60 {
			t.Fatalf("%s: Retry-After %d for a one-day wait, want within [86400, 86460]", id, v)
		}
		if j.Seconds(id, day) != v {
			t.Fatalf("%s: two answers for one identity", id)
		}
		values[v]++
	}
	if len(values) < 50 {
		t.Errorf("500 clients spread over only %d values", len(values))
	}
	// Up to two minutes, the cap does not bind: the same as an uncapped 50%.
	for _, d := range []time.Duration{time.Second, 10 * time.Second, 119 * time.Second, 120 * time.Second} {
		for i := range 100 {
			id := fmt.Sprint("c", i)
			if got, want := j.Seconds(id, d), uncapped(id, d, 0.5); got != want {
				t.Fatalf("%v %s: %d, uncapped %d", d, id, got, want)
			}
		}
	}
	// Another cap, rounded up to whole seconds; a zero cap or fraction is
	// no jitter.
	for _, c := range []struct {
		j   Jitter
		max int64
	}{
		{Jitter{Fraction: 0.5, Max: 1500 * time.Millisecond}, 2},
		{Jitter{Fraction: 1, Max: 10 * time.Second}, 10},
		{Jitter{Fraction: 0.5}, 0},
		{Jitter{Max: time.Hour}, 0},
	} {
		hi := int64(0)
		for i := range 300 {
			hi = max(hi, c.j.Seconds(fmt.Sprint("c", i), day)-86400)
		}
		if hi != c.max {
			t.Errorf("%+v: the largest jitter over 300 clients is %d s, want %d", c.j, hi, c.max)
		}
	}
}

func TestJitter(t *testing.T) {
	if jitterFraction("alice") != jitterFraction("alice") {
		t.Fatal("the same identity must get the same offset")
	}
	seen := map[int64]bool{}
	for _, id := range []string{"alice", "bob", "carol", "dave", "erin", "frank", "10.0.0.1", "10.0.0.2"} {
		f := jitterFraction(id)
		if f < 0 || f >= 1 {
			t.Fatalf("fraction %v out of [0,1)", f)
		}
		s := uncapped(id, 10*time.Second, 0.5)
		if s < 10 || s > 15 {
			t.Errorf("%s: Retry-After %d outside [10, 15]", id, s)
		}
		seen[s] = true
	}
	if len(seen) < 3 {
		t.Errorf("8 clients got only %d distinct Retry-After values", len(seen))
	}
	if got := uncapped("x", 100*time.Millisecond, 0); got != 1 {
		t.Errorf("0.1 s rounds up to 1 s, got %d", got)
	}
	// Every wait stays within [raw, ceil(1.5 raw)], and spreads, even 1 s.
	for _, raw := range []int64{1, 2, 3, 10, 61} {
		values := map[int64]int{}
		for i := range 200 {
			v := uncapped(fmt.Sprint("client-", i), time.Duration(raw)*time.Second-time.Millisecond, 0.5)
			if v < raw || v > (3*raw+1)/2 {
				t.Fatalf("raw %d s: Retry-After %d outside [%d, %d]", raw, v, raw, (3*raw+1)/2)
			}
			values[v]++
		}
		if len(values) < 2 {
			t.Errorf("raw %d s: 200 clients all got %v", raw, values)
		}
	}
}

// uncapped is Jitter{Fraction: frac}.Seconds(identity, d) without a cap
// on the jitter: ceil(d) plus up to frac of it.
func uncapped(identity string, d time.Duration, frac float64) int64 {
	return Jitter{Fraction: frac, Max: time.Duration(math.MaxInt64)}.Seconds(identity, d)
}
