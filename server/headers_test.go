package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/store/memstore"
)

// TestHeadersDraftForm: the gateway and forward auth write the RateLimit
// headers as the ratelimit-headers draft wants them: whole quotas (a
// burst of 2.5 is q=2 and RateLimit-Limit 2), a concurrency rule as a
// quota of concurrent requests without a window (no t, no
// RateLimit-Reset while it allows), and on a 429 it caused a short
// Retry-After (1 s and its jitter), not its lease TTL.
func TestHeadersDraftForm(t *testing.T) {
	held, release := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			close(held)
			<-release
		}
	}))
	t.Cleanup(up.Close)
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"trusted_proxies": ["127.0.0.1/32"], "rules": [
	  {"name": "slots", "limit_keys": ["header:x-api-key"], "algorithm": "concurrency",
	   "algorithm_config": {"max_in_flight": 1, "lease_ttl": "2m"}},
	  {"name": "frac", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 2.5}}
	]}`)
	gw := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1}, memstore.New())
	fa := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())

	check := func(what string, h http.Header, want map[string]string) {
		t.Helper()
		for k, v := range want {
			if got, ok := h[http.CanonicalHeaderKey(k)]; v == "" && ok {
				t.Errorf("%s: %s %q, want none", what, k, got)
			} else if v != "" && h.Get(k) != v {
				t.Errorf("%s: %s %q, want %q", what, k, h.Get(k), v)
			}
		}
		if err := sfv.CheckHeaders(h.Get); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	allowed := map[string]string{
		"RateLimit-Policy":    `"slots";q=1;qu="concurrent-requests", "frac";q=2;w=9000`,
		"RateLimit":           `"slots";r=0, "frac";r=1;t=3600`,
		"RateLimit-Limit":     "1",
		"RateLimit-Remaining": "0",
		"RateLimit-Reset":     "",
		"Retry-After":         "",
	}
	resp, _ := ask(t, fa.base, "", "GET", "/x", "X-Api-Key", "k")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("forward auth: %d", resp.StatusCode)
	}
	check("forward auth", resp.Header, allowed)

	done := make(chan *http.Response)
	go func() {
		resp, _ := gwGet(t, gw.base, "/hold", "k")
		done <- resp
	}()
	<-held
	resp, body := gwGet(t, gw.base, "/x", "k")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("while the slot is held: %d %s", resp.StatusCode, body)
	}
	ra := resp.Header.Get("Retry-After")
	if ra != "1" && ra != "2" {
		t.Errorf("429: Retry-After %q, want 1 or 2 (a slot frees when a request ends), not the lease TTL", ra)
	}
	check("the gateway's 429", resp.Header, map[string]string{
		"RateLimit-Policy":    `"slots";q=1;qu="concurrent-requests", "frac";q=2;w=9000`,
		"RateLimit":           fmt.Sprintf(`"slots";r=0;t=%s, "frac";r=1;t=3600`, ra),
		"RateLimit-Limit":     "1",
		"RateLimit-Remaining": "0",
		"RateLimit-Reset":     ra,
	})
	close(release)
	resp = <-done
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the holder: %d", resp.StatusCode)
	}
	check("the gateway's 200", resp.Header, allowed)
}
