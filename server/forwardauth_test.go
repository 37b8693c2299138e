package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/store/memstore"
)

// forwardRules limit a path and method by client, and every request by
// API key with its cost in a query parameter: every source a forwarded
// request rebuilds (path, method, query, header, client IP).
const forwardRules = `{"trusted_proxies": ["127.0.0.1/32"], "rules": [
  {"name": "search", "limit_keys": ["ip:address"], "match": {"path": "/search/*", "method": "GET"},
   "algorithm_config": {"rate": 1, "period": "1h", "burst": 2}},
  {"name": "free", "limit_keys": ["header:x-api-key"],
   "algorithm_config": {"rate": 1, "period": "1h", "burst": 3, "cost_source": "query:weight", "default_cost": 1}}]}`

// ask sends drip's forward auth what Traefik's ForwardAuth sends: a GET
// with the client's headers, and X-Forwarded-Method, -Proto, -Host, -Uri
// and -For (the client's address appended to the chain it came with).
func ask(t *testing.T, base, query, method, target string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/v1/forward-auth"+query, nil)
	req.Header.Set("X-Forwarded-Method", method)
	req.Header.Set("X-Forwarded-Proto", "https")
	req.Header.Set("X-Forwarded-Host", "app.example")
	req.Header.Set("X-Forwarded-Uri", target)
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
			continue
		}
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// rateLimitHeaders are the headers a decision writes.
var rateLimitHeaders = []string{"RateLimit-Policy", "RateLimit", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "Retry-After"}

// TestForwardAuthAsGateway: forward auth decides the request a proxy
// describes exactly as the gateway decides that request itself: the same
// statuses, RateLimit headers, Retry-After and problem bodies, request
// after request, with the same rules on two servers.
func TestForwardAuthAsGateway(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, forwardRules)
	up := newUpstream(t)
	gw := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1}, memstore.New())
	fa := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())

	steps := []struct {
		method, target, client, key string
		allowed                     bool
	}{
		{"GET", "/search/a?weight=1", "203.0.113.7", "k1", true},
		{"GET", "/x/../search/b", "203.0.113.7", "k1", true}, // the path as the app routes it
		{"POST", "/search/c", "203.0.113.7", "k1", true},     // search limits GET only
		{"GET", "/search/d", "203.0.113.7", "k1", false},     // search is empty
		{"GET", "/search/d", "198.51.100.1", "k2", true},     // another client, another key
		{"GET", "/big?weight=2", "198.51.100.1", "k2", true},
		{"DELETE", "/big?weight=2", "198.51.100.1", "k2", false}, // k2 has 0 left, 2 asked
		{"GET", "/big?weight=9", "198.51.100.1", "k3", false},    // over the burst: never
		{"GET", "/other", "198.51.100.1", "", true},              // no key: free does not apply
	}
	for i, st := range steps {
		// The gateway behind a trusted proxy that sent the client's
		// address; forward auth asked by that proxy.
		req, _ := http.NewRequest(st.method, gw.base+st.target, nil)
		req.Header.Set("X-Forwarded-For", st.client)
		if st.key != "" {
			req.Header.Set("X-Api-Key", st.key)
		}
		gresp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		gbody, _ := io.ReadAll(gresp.Body)
		gresp.Body.Close()
		fresp, fbody := ask(t, fa.base, "", st.method, st.target, "X-Forwarded-For", st.client, "X-Api-Key", st.key)

		want := http.StatusOK
		if !st.allowed {
			want = gresp.StatusCode
			if want != http.StatusTooManyRequests {
				t.Fatalf("step %d: the gateway answered %d %q, want 429", i, gresp.StatusCode, gbody)
			}
			if string(gbody) != fbody {
				t.Errorf("step %d: forward auth's body %q, the gateway's %q", i, fbody, gbody)
			}
		} else if gresp.StatusCode != http.StatusOK {
			t.Fatalf("step %d: the gateway answered %d %q, want 200", i, gresp.StatusCode, gbody)
		} else if fbody != "" {
			t.Errorf("step %d: forward auth allowed with a body %q", i, fbody)
		}
		if fresp.StatusCode != want {
			t.Fatalf("step %d: forward auth answered %d %q, want %d", i, fresp.StatusCode, fbody, want)
		}
		for _, h := range rateLimitHeaders {
			if g, f := gresp.Header.Values(h), fresp.Header.Values(h); strings.Join(g, "|") != strings.Join(f, "|") {
				t.Errorf("step %d: %s: forward auth %q, the gateway %q", i, h, f, g)
			}
		}
		if err := sfv.CheckHeaders(fresp.Header.Get); err != nil {
			t.Errorf("step %d: %v", i, err)
		}
		for _, h := range []string{"Drip-Status", "Drip-Problem"} {
			if v := fresp.Header.Get(h); v != "" {
				t.Errorf("step %d: %s %q without deny_status", i, h, v)
			}
		}
	}
	if n := up.hits.Load(); n != 6 {
		t.Errorf("the gateway's upstream saw %d requests, want the 6 allowed", n)
	}
	_, metrics := call(t, "GET", fa.admin+"/metrics", "")
	for _, want := range []string{
		`drip_decisions_total{mode="enforce",outcome="allowed",rule="free"} 5`,
		`drip_decisions_total{mode="enforce",outcome="denied",rule="search"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("forward auth's metrics lack %q:\n%s", want, grep(metrics, "drip_decisions_total"))
		}
	}
}

// TestForwardAuthNginxHeaders: the headers nginx configs set
// (X-Original-Method, X-Original-URI) describe the request as well, and
// deny_status=403 (or 401) turns a denial into a status auth_request
// passes on, with the real status and body in Drip-Status and
// Drip-Problem.
func TestForwardAuthNginxHeaders(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, forwardRules)
	srv := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	nginx := func(query, target string) (*http.Response, string) {
		return ask(t, srv.base, query, "", "",
			"X-Forwarded-Method", "", "X-Forwarded-Uri", "",
			"X-Original-Method", "GET", "X-Original-URI", target, "X-Forwarded-For", "203.0.113.9")
	}
	for i := range 2 {
		if resp, body := nginx("?deny_status=403", "/search/"+strconv.Itoa(i)); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	for _, status := range []int{403, 401} {
		resp, body := nginx("?deny_status="+strconv.Itoa(status), "/search/x")
		if resp.StatusCode != status {
			t.Fatalf("deny_status=%d: %d %q", status, resp.StatusCode, body)
		}
		if got := resp.Header.Get("Drip-Status"); got != "429" {
			t.Errorf("deny_status=%d: Drip-Status %q, want 429", status, got)
		}
		if got := resp.Header.Get("Drip-Problem"); got+"\n" != body {
			t.Errorf("deny_status=%d: Drip-Problem %q, body %q: want the body on one line", status, got, body)
		}
		var p struct {
			Status     int    `json:"status"`
			Rule       string `json:"rule"`
			RetryAfter int    `json:"retry_after"`
		}
		if err := json.Unmarshal([]byte(body), &p); err != nil || p.Status != 429 || p.Rule != "search" {
			t.Errorf("deny_status=%d: body %q (%v): want the 429's problem", status, body, err)
		}
		if ra := resp.Header.Get("Retry-After"); ra == "" || ra != strconv.Itoa(p.RetryAfter) {
			t.Errorf("deny_status=%d: Retry-After %q, body's %d", status, ra, p.RetryAfter)
		}
		if resp.Header.Get("RateLimit-Policy") == "" {
			t.Errorf("deny_status=%d: no RateLimit headers", status)
		}
	}
	if resp, body := nginx("?deny_status=429", "/search/x"); resp.StatusCode != 429 || resp.Header.Get("Drip-Status") != "429" {
		t.Errorf("deny_status=429: %d %q %v", resp.StatusCode, body, resp.Header)
	}
}

// TestForwardAuthRefuses: an ask that does not describe one request, or
// that comes from a caller not in trusted_proxies, is a 400 that takes
// nothing.
func TestForwardAuthRefuses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, forwardRules)
	srv := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	untrustedPath := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, untrustedPath, strings.Replace(forwardRules, "127.0.0.1/32", "10.0.0.0/8", 1))
	untrusted := start(t, Config{Rules: untrustedPath, WatchEvery: -1}, memstore.New())

	key := []string{"X-Api-Key", "k", "X-Forwarded-For", "203.0.113.7"}
	cases := []struct {
		name, base, query, method, target string
		hdr                               []string
		want                              string // in the error
	}{
		{"caller not trusted", untrusted.base, "", "GET", "/search/a", nil, "trusted_proxies"},
		{"no method", srv.base, "", "", "/search/a", []string{"X-Forwarded-Method", ""}, "X-Forwarded-Method"},
		{"no target", srv.base, "", "GET", "", []string{"X-Forwarded-Uri", ""}, "X-Forwarded-Uri"},
		{"empty target", srv.base, "", "GET", "", nil, "empty"},
		{"two targets", srv.base, "", "GET", "/search/a", []string{"X-Original-URI", "/free"}, "disagree"},
		{"two target lines", srv.base, "", "GET", "/search/a", []string{"X-Forwarded-Uri", "/free"}, "disagree"},
		{"two methods", srv.base, "", "GET", "/search/a", []string{"X-Original-Method", "POST"}, "disagree"},
		{"not a method", srv.base, "", "GE T", "/search/a", nil, "not an HTTP method"},
		{"not a target", srv.base, "", "GET", "search", nil, "not valid"},
		{"bad escape", srv.base, "", "GET", "/%zz", nil, "not valid"},
		// An app that stops the path at '#' would route "/search" where
		// drip would read "/free"; one on Windows reads '\' as '/'.
		{"fragment", srv.base, "", "GET", "/search#/../free", nil, "cannot hold"},
		{"backslash", srv.base, "", "GET", `/free\..\search\a`, nil, "cannot hold"},
		{"bad deny_status", srv.base, "?deny_status=200", "GET", "/search/a", nil, "deny_status"},
		{"two deny_status", srv.base, "?deny_status=403&deny_status=401", "GET", "/search/a", nil, "deny_status"},
	}
	for _, c := range cases {
		resp, body := ask(t, c.base, c.query, c.method, c.target, append(append([]string(nil), key...), c.hdr...)...)
		if resp.StatusCode != 400 || !strings.Contains(body, c.want) || resp.Header.Get("RateLimit") != "" {
			t.Errorf("%s: %d %q, want 400 naming %q", c.name, resp.StatusCode, body, c.want)
		}
	}
	// Nothing was taken: the first real ask finds full buckets.
	resp, body := ask(t, srv.base, "", "GET", "/search/a", key...)
	if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != `"search";r=1;t=3600, "free";r=2;t=3600` {
		t.Errorf("after the refusals: %d %q, RateLimit %q: want full buckets less one", resp.StatusCode, body, resp.Header.Get("RateLimit"))
	}
}

// TestTraefikSnippet holds examples/traefik to what drip answers: there is
// no Traefik here, so the test checks the snippet's assumptions, that
// Traefik's ForwardAuth (as documented: the client's headers and
// X-Forwarded-Method, -Uri, -Host, -Proto and -For sent with a GET; a
// non-2xx answer passed to the client; authResponseHeaders copied on a
// 2xx) gets from drip what the snippet says.
func TestTraefikSnippet(t *testing.T) {
	var static struct {
		EntryPoints map[string]struct{ Address string } `yaml:"entryPoints"`
		Providers   struct{ File struct{ Filename string } }
	}
	var dynamic struct {
		HTTP struct {
			Routers map[string]struct {
				EntryPoints []string `yaml:"entryPoints"`
				Middlewares []string
				Service     string
			}
			Middlewares map[string]struct {
				ForwardAuth *struct {
					Address             string
					TrustForwardHeader  bool     `yaml:"trustForwardHeader"`
					AuthResponseHeaders []string `yaml:"authResponseHeaders"`
				} `yaml:"forwardAuth"`
				Headers *struct {
					CustomRequestHeaders map[string]string `yaml:"customRequestHeaders"`
				}
			}
			Services map[string]struct {
				LoadBalancer struct{ Servers []struct{ URL string } } `yaml:"loadBalancer"`
			}
		} `yaml:"http"`
	}
	readYAML(t, "../examples/traefik/traefik.yml", &static)
	readYAML(t, "../examples/traefik/dynamic.yml", &dynamic)
	if static.EntryPoints["web"].Address != "127.0.0.1:8000" || static.Providers.File.Filename != "dynamic.yml" {
		t.Errorf("traefik.yml: %+v", static)
	}
	router := dynamic.HTTP.Routers["app"]
	if len(router.Middlewares) != 2 || router.Service != "app" || len(router.EntryPoints) != 1 || router.EntryPoints[0] != "web" {
		t.Fatalf("dynamic.yml: router %+v", router)
	}
	clean, fa := dynamic.HTTP.Middlewares[router.Middlewares[0]].Headers, dynamic.HTTP.Middlewares[router.Middlewares[1]].ForwardAuth
	if clean == nil || fa == nil {
		t.Fatalf("dynamic.yml: the router's middlewares are not the headers and forwardAuth ones: %v", router.Middlewares)
	}
	if fa.Address != "http://127.0.0.1:8080"+forwardAuthPath || fa.TrustForwardHeader {
		t.Errorf("dynamic.yml: forwardAuth %+v: want drip's address and trustForwardHeader off", fa)
	}
	if s := dynamic.HTTP.Services[router.Service].LoadBalancer.Servers; len(s) != 1 || s[0].URL != "http://127.0.0.1:9000" {
		t.Errorf("dynamic.yml: service %+v", s)
	}

	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, forwardRules)
	srv := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	// A client's own X-Original-* headers would make drip refuse the
	// ask; drip-clean drops them.
	client := []string{"X-Api-Key", "k", "X-Forwarded-For", "203.0.113.7", "X-Original-URI", "/forged", "X-Original-Method", "PUT"}
	if resp, body := ask(t, srv.base, "", "GET", "/search/a", client...); resp.StatusCode != 400 {
		t.Errorf("an ask with the client's X-Original-URI: %d %q, want 400", resp.StatusCode, body)
	}
	var sent []string
	for i := 0; i < len(client); i += 2 {
		dropped := false
		for name, v := range clean.CustomRequestHeaders {
			dropped = dropped || (http.CanonicalHeaderKey(name) == http.CanonicalHeaderKey(client[i]) && v == "")
		}
		if !dropped {
			sent = append(sent, client[i], client[i+1])
		}
	}
	for i := range 2 {
		resp, body := ask(t, srv.base, "", "GET", "/search/a", sent...)
		if resp.StatusCode/100 != 2 {
			t.Fatalf("ask %d as Traefik sends it: %d %q, want a 2xx", i, resp.StatusCode, body)
		}
		// Every RateLimit header of the answer is one Traefik copies.
		for name := range resp.Header {
			if !strings.HasPrefix(name, "Ratelimit") {
				continue
			}
			copied := false
			for _, h := range fa.AuthResponseHeaders {
				copied = copied || http.CanonicalHeaderKey(h) == name
			}
			if !copied {
				t.Errorf("drip answers %s, not in authResponseHeaders %q", name, fa.AuthResponseHeaders)
			}
		}
		for _, h := range fa.AuthResponseHeaders {
			if resp.Header.Get(h) == "" {
				t.Errorf("authResponseHeaders lists %s, which drip did not send", h)
			}
		}
	}
	resp, body := ask(t, srv.base, "", "GET", "/search/a", sent...)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || resp.Header.Get("RateLimit") == "" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") || !strings.Contains(body, `"rule":"search"`) {
		t.Errorf("over the limit: %d %v %q: want the 429 Traefik passes on, with Retry-After, RateLimit and the problem body", resp.StatusCode, resp.Header, body)
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestForwardAuthExampleRules: examples/forward-auth.json, the rules the
// README runs the proxies with, trusts a proxy on loopback (IPv4 and
// IPv6) and keys on the client it names.
func TestForwardAuthExampleRules(t *testing.T) {
	srv := start(t, Config{Rules: "../examples/forward-auth.json", WatchEvery: -1}, memstore.New())
	for _, a := range []string{"127.0.0.1", "::1"} {
		if !httplimit.FromTrustedProxy(&http.Request{RemoteAddr: net.JoinHostPort(a, "1234")}, srv.lim.Rules().TrustedProxies) {
			t.Errorf("examples/forward-auth.json does not trust a proxy at %s", a)
		}
	}
	for _, client := range []string{"203.0.113.7", "203.0.113.8"} {
		resp, body := ask(t, srv.base, "", "GET", "/", "X-Forwarded-For", client)
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != `"per-ip";r=19;t=1` {
			t.Errorf("client %s: %d %q, RateLimit %q: want per-ip's first take", client, resp.StatusCode, body, resp.Header.Get("RateLimit"))
		}
	}
}

// TestForwardAuthReleasesSlots: forward auth never learns when the
// request it allowed ends, so a concurrency rule's slot is given back as
// the ask is answered: with one slot, ask after ask is allowed, and the
// store holds no lease afterwards.
func TestForwardAuthReleasesSlots(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"trusted_proxies": ["127.0.0.1/32"], "rules": [
  {"name": "one-at-a-time", "limit_keys": ["global"], "algorithm": "concurrency",
   "algorithm_config": {"max_in_flight": 1, "lease_ttl": "1h"}}]}`)
	fa := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	for i := range 3 {
		resp, body := ask(t, fa.base, "", "GET", "/x")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("ask %d: %d %s; want 200 (the slot of the ask before was given back)", i, resp.StatusCode, body)
		}
	}
}

// TestForwardAuthEncodedPaths: the path rules see the target as apps
// route it (percent-decoded, parameters dropped, dot segments removed as
// RFC 3986 does, a last "." or ".." leaving a directory), so that
// spelling a path another way does not dodge the search rule (more in
// TestForwardAuthPathSpellings).
func TestForwardAuthEncodedPaths(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, forwardRules)
	srv := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	for i, target := range []string{"/search/a", "/%73earch/a", "//search/a", "/x/../search/a", "/search/a/..", "/search/.", "/search/a/%2e%2e", "/x/..;/search/a", "/search%2Fa"} {
		// A client of its own for each: the search bucket is per IP.
		resp, body := ask(t, srv.base, "", "GET", target, "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1))
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("RateLimit-Policy"), `"search"`) {
			t.Errorf("%s: %d %q, policy %q: want the search rule", target, resp.StatusCode, body, resp.Header.Get("RateLimit-Policy"))
		}
	}
}

// TestForwardAuthAdaptiveLearnsNothing: forward auth answers before the
// request it guards runs, so an adaptive rule would learn the latency
// and the outcome of the ask: near zero, always a success. It learns
// nothing from forward auth (its windows here are 1ms: many end), and its
// limit stays where it starts.
func TestForwardAuthAdaptiveLearnsNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"trusted_proxies": ["127.0.0.1/32"], "rules": [
  {"name": "upstream", "limit_keys": ["global"], "algorithm": "adaptive", "algorithm_config": {"window": "1ms"}}]}`)
	fa := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				ask(t, fa.base, "", "GET", "/x")
			}
		}()
	}
	wg.Wait()
	after := fa.eng.Adaptive()
	if len(after) != 1 || after[0].Baseline != 0 {
		t.Errorf("after 800 asks through forward auth in windows of 1ms, the rule learned %+v: want no baseline", after)
	}
}
