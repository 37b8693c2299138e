package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// upstream is a real HTTP server behind the gateway that counts the
// requests reaching it.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
	mu   sync.Mutex
	last http.Header
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		u.mu.Lock()
		u.last = r.Header.Clone()
		u.mu.Unlock()
		w.Header().Set("X-Upstream", "yes")
		fmt.Fprintf(w, "upstream saw %s %s", r.Method, r.URL.Path)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) lastHeader() http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last
}

// gwGet sends GET path to the gateway with the x-api-key header (if key is
// not empty) and returns the response with its body read.
func gwGet(t *testing.T, base, path, key string) (*http.Response, string) {
	t.Helper()
	var hdr []string
	if key != "" {
		hdr = []string{"X-Api-Key", key}
	}
	return fetch(t, http.DefaultClient, base+path, hdr...)
}

func TestGateway(t *testing.T) {
	up := newUpstream(t)
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"rules": [
	  {"name": "free", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	   "algorithm_config": {"rate": 1, "period": "1h", "burst": 3}},
	  {"name": "watch", "limit_keys": ["header:x-api-key"], "mode": "shadow", "algorithm": "token_bucket",
	   "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}}
	]}`)
	srv := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1}, memstore.New())

	for i := range 3 {
		resp, body := gwGet(t, srv.base, "/hello", "k1")
		if resp.StatusCode != 200 || body != "upstream saw GET /hello" || resp.Header.Get("X-Upstream") != "yes" {
			t.Fatalf("request %d through the gateway: %d %q", i, resp.StatusCode, body)
		}
		want := map[string]string{
			"RateLimit-Policy":    `"free";q=3;w=10800`,
			"RateLimit":           fmt.Sprintf(`"free";r=%d;t=%d`, 2-i, 3600*(i+1)),
			"RateLimit-Limit":     "3",
			"RateLimit-Remaining": strconv.Itoa(2 - i),
			"RateLimit-Reset":     strconv.Itoa(3600 * (i + 1)),
		}
		for h, v := range want {
			if got := resp.Header.Get(h); got != v {
				t.Errorf("request %d: %s: %q, want %q", i, h, got, v)
			}
		}
		if err := sfv.CheckHeaders(resp.Header.Get); err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
	if xff := up.lastHeader().Get("X-Forwarded-For"); xff != "127.0.0.1" {
		t.Errorf("upstream saw X-Forwarded-For %q, want 127.0.0.1", xff)
	}

	resp, body := gwGet(t, srv.base, "/hello", "k1")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("fourth request: %d %q, want 429", resp.StatusCode, body)
	}
	if up.hits.Load() != 3 {
		t.Fatalf("upstream hits %d, want 3: a denied request reached it", up.hits.Load())
	}
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || ra < 3600 || ra > 5400 {
		t.Fatalf("Retry-After %q, want within [3600, 5400]", resp.Header.Get("Retry-After"))
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
		t.Errorf("429 Content-Type %q", ct)
	}
	var problem map[string]any
	if err := json.Unmarshal([]byte(body), &problem); err != nil || !strings.Contains(body, "free") || !strings.Contains(body, "token_bucket_exceeded") {
		t.Errorf("429 body %q: want problem+json naming the rule and the reason (%v)", body, err)
	}
	if got := resp.Header.Get("RateLimit-Remaining"); got != "0" {
		t.Errorf("429 RateLimit-Remaining %q", got)
	}
	if err := sfv.CheckHeaders(resp.Header.Get); err != nil {
		t.Errorf("429: %v", err)
	}

	// Another key has its own bucket; a request without the key is not
	// limited by the rule (and carries no headers).
	if resp, _ := gwGet(t, srv.base, "/", "k2"); resp.StatusCode != 200 || resp.Header.Get("RateLimit-Remaining") != "2" {
		t.Fatalf("other key: %d %v", resp.StatusCode, resp.Header)
	}
	for range 5 {
		if resp, _ := gwGet(t, srv.base, "/", ""); resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
			t.Fatalf("request without a key: %d %v", resp.StatusCode, resp.Header)
		}
	}
	// The decision API is not served in gateway mode: it goes upstream.
	if resp, body := gwGet(t, srv.base, "/v1/take", ""); resp.StatusCode != 200 || !strings.HasPrefix(body, "upstream saw") {
		t.Fatalf("/v1/take on the gateway: %d %q", resp.StatusCode, body)
	}

	_, metrics := call(t, "GET", srv.admin+"/metrics", "")
	for _, want := range []string{
		`drip_decisions_total{mode="enforce",outcome="allowed",rule="free"} 4`,
		`drip_decisions_total{mode="enforce",outcome="denied",rule="free"} 1`,
		`drip_shadow_denials_total{rule="watch"} 3`, // k1's 2nd, 3rd and 4th (the 4th, denied by free, is only peeked)
		`drip_store_circuit_state{state="closed"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q:\n%s", want, grep(metrics, "drip_decisions_total")+grep(metrics, "shadow")+grep(metrics, "circuit"))
		}
	}
}

func TestGatewayUpstreamDown(t *testing.T) {
	up := newUpstream(t)
	up.Close()
	srv := start(t, Config{Upstream: up.URL}, memstore.New())
	resp, body := gwGet(t, srv.base, "/", "")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "upstream unavailable") {
		t.Fatalf("upstream down: %d %q, want 502", resp.StatusCode, body)
	}
}

// TestGatewayStoreDown: each on_error policy with a store that is down;
// the gateway stays ready where its policy still decides (allow, local),
// not where it fails closed (deny).
func TestGatewayStoreDown(t *testing.T) {
	for _, tc := range []struct {
		policy string
		codes  []int // for 5 requests of one client
		metric string
	}{
		{"allow", []int{200, 200, 200, 200, 200}, `drip_decisions_total{mode="enforce",outcome="error_allowed",rule="r"} 5`},
		{"deny", []int{503, 503, 503, 503, 503}, `drip_decisions_total{mode="enforce",outcome="error_denied",rule="r"} 5`},
		// local: half of the burst of 4, per instance.
		{"local", []int{200, 200, 429, 429, 429}, `drip_local_fallback_decisions_total{rule="r"} 5`},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			up := newUpstream(t)
			path := filepath.Join(t.TempDir(), "rules.json")
			writeFile(t, path, `{"on_error": "`+tc.policy+`", "local_share": 0.5,
			  "circuit_breaker": {"failures": 2, "cooldown": "1h"},
			  "rules": [{"name": "r", "limit_keys": ["header:x-api-key"],
			    "algorithm_config": {"rate": 1, "period": "1h", "burst": 4}}]}`)
			srv := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1}, failing{})
			for i, want := range tc.codes {
				resp, body := gwGet(t, srv.base, "/", "k")
				if resp.StatusCode != want {
					t.Fatalf("request %d with the store down and on_error %s: %d %q, want %d", i, tc.policy, resp.StatusCode, body, want)
				}
			}
			_, metrics := call(t, "GET", srv.admin+"/metrics", "")
			for _, want := range []string{
				tc.metric,
				`drip_store_errors_total{op="take"} 2`, // then the breaker opened: no more calls
				`drip_store_circuit_state{state="open"} 1`,
			} {
				if !strings.Contains(metrics, want) {
					t.Errorf("metrics lack %q:\n%s", want, grep(metrics, "drip_"))
				}
			}
			want := map[string]int{"allow": 200, "deny": 503, "local": 200}[tc.policy]
			if code, body := call(t, "GET", srv.admin+"/readyz", ""); code != want || !strings.Contains(body, "unreachable") {
				t.Errorf("/readyz with the store down and on_error %s: %d %s, want %d", tc.policy, code, body, want)
			}
		})
	}
}

// TestGatewayReloadUnderLoad: clients keep going through the gateway while
// the rules are reloaded again and again; the buckets are keyed by rule
// name, so exactly the burst is granted.
func TestGatewayReloadUnderLoad(t *testing.T) {
	testGatewayReloadUnderLoad(t, memstore.New())
}

func testGatewayReloadUnderLoad(t *testing.T, store store.Store) {
	const burst = 25
	up := newUpstream(t)
	path := rulesFile(t, "", burst, "api")
	srv := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1, StoreTimeout: teststores.Timeout}, store)
	key := testserver.Prefix() + "load" // fresh on a shared store
	var granted, denied atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, body := gwGet(t, srv.base, "/", key)
				switch resp.StatusCode {
				case 200:
					granted.Add(1)
				case 429:
					denied.Add(1)
				default:
					t.Errorf("gateway during reloads: %d %q", resp.StatusCode, body)
					return
				}
			}
		})
	}
	reloadAlternating(t, srv, path, burst, 40, 3*time.Millisecond, func() bool { return denied.Load() > 0 })
	close(stop)
	wg.Wait()
	if g := granted.Load(); g != burst || denied.Load() == 0 || up.hits.Load() != burst {
		t.Fatalf("granted %d, denied %d, upstream hits %d across 40 reloads; want exactly %d granted", g, denied.Load(), up.hits.Load(), burst)
	}
}

// TestGatewayClients: client identity and costs end to end: a spoofed
// X-Forwarded-For from an untrusted peer changes nothing; behind a trusted
// proxy each client has its own bucket and its own, stable, Retry-After
// jitter; a cost header of 5 takes 5, and abc or -3 take default_cost.
func TestGatewayClients(t *testing.T) {
	up := newUpstream(t)
	get := func(base string, hdr ...string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", base+"/", nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	rule := `{"name": "ip", "limit_keys": ["ip:address"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 10,
	   "cost_source": "header:x-weight", "default_cost": 2}}`

	untrusted := filepath.Join(t.TempDir(), "untrusted.json")
	writeFile(t, untrusted, `{"rules": [`+rule+`]}`)
	srv := start(t, Config{Rules: untrusted, Upstream: up.URL, WatchEvery: -1}, memstore.New())
	for i, tc := range []struct{ xff, weight, remaining string }{
		{"", "5", "5"},
		{"203.0.113.1", "abc", "3"}, // spoofed: still the peer's bucket; abc costs default_cost
		{"203.0.113.2", "-3", "1"},
	} {
		resp := get(srv.base, "X-Forwarded-For", tc.xff, "X-Weight", tc.weight)
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Remaining") != tc.remaining {
			t.Fatalf("request %d (X-Forwarded-For %q, X-Weight %q): %d, remaining %q, want %s", i, tc.xff, tc.weight, resp.StatusCode, resp.Header.Get("RateLimit-Remaining"), tc.remaining)
		}
	}

	trusted := filepath.Join(t.TempDir(), "trusted.json")
	writeFile(t, trusted, `{"trusted_proxies": ["127.0.0.1/32"], "rules": [`+rule+`]}`)
	srv = start(t, Config{Rules: trusted, Upstream: up.URL, WatchEvery: -1}, memstore.New())
	retry := map[string]string{}
	for c := range 8 {
		client := fmt.Sprintf("198.51.100.%d", c+1)
		for range 5 {
			get(srv.base, "X-Forwarded-For", client) // 5 x 2 = the burst
		}
		for range 3 {
			resp := get(srv.base, "X-Forwarded-For", client)
			ra := resp.Header.Get("Retry-After")
			n, err := strconv.Atoi(ra)
			if resp.StatusCode != 429 || err != nil || n < 7200 || n > 10800 {
				t.Fatalf("client %s over its burst: %d, Retry-After %q, want 429 within [7200, 10800]", client, resp.StatusCode, ra)
			}
			if prev, ok := retry[client]; ok && prev != ra {
				t.Fatalf("client %s got Retry-After %s then %s: want the same", client, prev, ra)
			}
			retry[client] = ra
		}
	}
	distinct := map[string]bool{}
	for _, ra := range retry {
		distinct[ra] = true
	}
	if len(distinct) < 4 {
		t.Fatalf("8 clients got only %d distinct Retry-After values: %v", len(distinct), retry)
	}
}

// TestReadyWithoutStore: with the store down, /readyz answers what the
// instance can still decide: a gateway whose enforced rules allow or
// decide locally is ready (a shadow rule that would deny changes no
// answer); one with an enforced rule that denies is not, nor is the
// decision API (503 without its store) or Envoy's rate limit service
// (UNAVAILABLE); each 503 names why. envoyproxy/ratelimit's
// /healthcheck answers alike.
func TestReadyWithoutStore(t *testing.T) {
	up := newUpstream(t)
	rule := func(name, onError, mode string) string {
		return `{"name": "` + name + `", "on_error": "` + onError + `", "mode": "` + mode + `", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rps": 1}}`
	}
	for _, tc := range []struct {
		name   string
		rules  []string
		cfg    Config
		reason string // "": ready
	}{
		{"local and allow", []string{rule("a", "local", "enforce"), rule("b", "allow", "enforce")}, Config{Upstream: up.URL}, ""},
		{"shadow deny", []string{rule("a", "local", "enforce"), rule("s", "deny", "shadow")}, Config{Upstream: up.URL}, ""},
		{"enforced deny", []string{rule("a", "local", "enforce"), rule("d", "deny", "enforce")}, Config{Upstream: up.URL}, `rule \"d\" fails closed`},
		{"decision API", []string{rule("a", "local", "enforce")}, Config{}, "the decision API answers 503"},
		{"Envoy", []string{rule("a", "local", "enforce")}, Config{Upstream: up.URL, GRPCListen: "127.0.0.1:0"}, "Envoy's rate limit service"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rules.json")
			writeFile(t, path, `{"rules": [`+strings.Join(tc.rules, ", ")+`]}`)
			cfg := tc.cfg
			cfg.Rules, cfg.WatchEvery = path, -1
			srv := start(t, cfg, failing{})
			code, body := call(t, "GET", srv.admin+"/readyz", "")
			if tc.reason == "" && (code != 200 || !strings.Contains(body, `"store":"unreachable"`)) ||
				tc.reason != "" && (code != 503 || !strings.Contains(body, tc.reason)) {
				t.Fatalf("/readyz: %d %s, want the reason %q (none: ready)", code, body, tc.reason)
			}
			// envoyproxy/ratelimit's /healthcheck follows /readyz.
			if hc, body := call(t, "GET", srv.admin+"/healthcheck", ""); (hc == 200) != (code == 200) {
				t.Fatalf("/healthcheck: %d %s, /readyz %d", hc, body, code)
			}
		})
	}
}
