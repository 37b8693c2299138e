package httplimit_test

import (
	"net/http"
	"testing"

	"github.com/driplimit/drip/internal/sfv"
)

// TestHeadersAreStructuredFields parses every header the middleware writes
// with a strict structured-field parser, on allowed requests and on 429s,
// with fractional bursts (decimals have at most three places) and rule
// names using every character a name may have.
func TestHeadersAreStructuredFields(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"rules": [
	  {"name": "a.B-c_9", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 0.3333333, "burst": 2.3333333}},
	  {"name": "free", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rps": 10, "burst": 20}}
	]}`))
	denied := false
	for i := range 4 {
		r := e.do("/", "X-Api-Key: k")
		if r.h.Get("RateLimit-Policy") == "" {
			t.Fatalf("request %d: no headers: %d %v", i, r.code, r.h)
		}
		if err := sfv.CheckHeaders(r.h.Get); err != nil {
			t.Errorf("request %d (%d): %v\n%v", i, r.code, err, r.h)
		}
		denied = denied || r.code == http.StatusTooManyRequests
	}
	if !denied {
		t.Error("no request was denied: the 429's headers went unchecked")
	}
}
