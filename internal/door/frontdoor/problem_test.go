package frontdoor_test

import (
	"testing"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/door/frontdoor"
	"github.com/driplimit/drip/rules"
)

// TestProblemDetailPlural: a 429's detail counts its seconds in English,
// "1 second" and "2 seconds".
func TestProblemDetailPlural(t *testing.T) {
	rule := &rules.Rule{Name: "free"}
	for _, c := range []struct {
		retry int64
		want  string
	}{
		{1, `rate limit "free" exceeded; retry after 1 second`},
		{2, `rate limit "free" exceeded; retry after 2 seconds`},
		{60, `rate limit "free" exceeded; retry after 60 seconds`},
	} {
		out := engine.Outcome{Reason: engine.ReasonTokenBucket, Top: &engine.Applied{Rule: rule}, RetryAfter: c.retry}
		if got := frontdoor.ProblemOf(&out).Detail; got != c.want {
			t.Errorf("Retry-After %d: detail %q, want %q", c.retry, got, c.want)
		}
	}
}
