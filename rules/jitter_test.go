package rules

import (
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/engine/retryafter"
)

func TestRetryAfterJitterField(t *testing.T) {
	const rule = `"rules": [{"name": "r", "limit_keys": ["global"], "algorithm_config": {"rps": 1}}]`
	s, err := Parse([]byte(`{`+rule+`}`), "default.json")
	if err != nil {
		t.Fatal(err)
	}
	if s.RetryJitter != retryafter.Default || s.RetryJitter != (retryafter.Jitter{Fraction: 0.5, Max: time.Minute}) {
		t.Errorf("default %+v", s.RetryJitter)
	}
	for src, want := range map[string]retryafter.Jitter{
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
	if s.RetryJitter != (retryafter.Jitter{Fraction: 0.25, Max: 30 * time.Second}) {
		t.Errorf("retry_after_jitter %+v", s.RetryJitter)
	}
}
