package httplimit_test

import (
	"os"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/driplimit/drip/rules"
)

// TestLimitFromClaims: a verified token's claim sets its bucket's burst,
// clamped to the file's bounds; a token whose signature fails claims
// nothing, and its bucket has the rule's own limit.
func TestLimitFromClaims(t *testing.T) {
	set, err := rules.ParseEnv([]byte(`{"jwt": {"hmac_secret_env": "SECRET"}, "rules": [
	  {"name": "api", "limit_keys": ["header:x-api-key"],
	   "algorithm_config": {"rate": 1, "period": "1m", "burst": 2},
	   "limit_from_claims": {"burst_claim": "rl_burst", "max_burst": 5}}]}`), "rules.json",
		rules.Env{Getenv: func(string) string { return hmacSecret }, ReadFile: os.ReadFile})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, nil, set)
	e.clock.Set(time.Now()) // tokens carry real times
	token := func(burst any) string {
		c := claims("any")
		c["rl_burst"] = burst
		return sign(t, jwt.SigningMethodHS256, []byte(hmacSecret), c, "")
	}
	for _, c := range []struct {
		key, token string
		burst      int
		policy     string
	}{
		{"k-claims-4", token(4), 4, `"api";q=4;w=240`},
		{"k-claims-str", token("3"), 3, `"api";q=3;w=180`},
		{"k-clamped", token(1000), 5, `"api";q=5;w=300`},
		{"k-forged", forge(t, token(4), claims("any", func(c jwt.MapClaims) { c["rl_burst"] = 5 })), 2, `"api";q=2;w=120`},
		{"k-none", "", 2, `"api";q=2;w=120`},
	} {
		hdr := []string{"X-Api-Key: " + c.key}
		if c.token != "" {
			hdr = append(hdr, "Authorization: Bearer "+c.token)
		}
		for i := range c.burst {
			r := e.do("/", hdr...)
			if r.code != 200 || r.remaining(t) != c.burst-1-i {
				t.Fatalf("%s: request %d: %d, remaining %v", c.key, i, r.code, r.h.Get("RateLimit-Remaining"))
			}
			if p := r.h.Get("RateLimit-Policy"); p != c.policy {
				t.Fatalf("%s: RateLimit-Policy %s, want %s", c.key, p, c.policy)
			}
		}
		if r := e.do("/", hdr...); r.code != 429 {
			t.Fatalf("%s: request past the burst of %d: %d", c.key, c.burst, r.code)
		}
	}
}
