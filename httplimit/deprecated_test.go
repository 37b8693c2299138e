//lint:file-ignore SA1019 the deprecated names are what this file checks

package httplimit_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/store/memstore"
)

// TestDeprecatedNames: the names Decide's outcome and the engine's
// options replaced still answer as before: Result renders as the
// functions do, and the option wrappers are the engine's options.
func TestDeprecatedNames(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	e := engine.New(memstore.New(), engine.WithClock(func() time.Time { return now }))
	set := parse(t, `{"rules": [{"name": "all", "limit_keys": ["global"],
		"algorithm_config": {"rate": 1, "period": "1m", "burst": 1}}]}`)
	l := httplimit.New(nil, set, httplimit.WithEngine(e), httplimit.WithTimeout(time.Hour))
	if l.Engine() != e {
		t.Fatal("WithEngine: not the shared engine")
	}
	l.Decide(context.Background(), httptest.NewRequest("GET", "/", nil))
	out := l.Decide(context.Background(), httptest.NewRequest("GET", "/", nil))
	res := httplimit.Result{Outcome: out}
	a, b := httptest.NewRecorder(), httptest.NewRecorder()
	res.WriteHeaders(a.Header())
	res.WriteError(a)
	httplimit.WriteHeaders(b.Header(), out)
	httplimit.WriteError(b, out)
	if res.Status() != 429 || httplimit.Status(out) != 429 || a.Body.String() != b.Body.String() ||
		fmt.Sprint(a.Header()) != fmt.Sprint(b.Header()) || string(res.ProblemJSON()) != string(httplimit.ProblemJSON(out)) ||
		res.Problem() != httplimit.ProblemOf(out) {
		t.Errorf("Result %d %v %s, outcome %d %v %s", res.Status(), a.Header(), a.Body, httplimit.Status(out), b.Header(), b.Body)
	}
}
