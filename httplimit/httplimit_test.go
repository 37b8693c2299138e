package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

// observer counts what the limiter reports.
type observer struct {
	mu        sync.Mutex
	decisions map[string]int // "rule/mode/outcome"
	errors    int
	calls     int
	states    []string
}

func (o *observer) Decision(rule string, mode rules.Mode, outcome engine.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.decisions == nil {
		o.decisions = map[string]int{}
	}
	o.decisions[rule+"/"+string(mode)+"/"+string(outcome)]++
}
func (o *observer) StoreError(error) { o.mu.Lock(); o.errors++; o.mu.Unlock() }
func (o *observer) StoreLatency(time.Duration) {
	o.mu.Lock()
	o.calls++
	o.mu.Unlock()
}
func (o *observer) BreakerState(s string)                { o.mu.Lock(); o.states = append(o.states, s); o.mu.Unlock() }
func (o *observer) Tokens(string, engine.Event, float64) {}

func (o *observer) count(key string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.decisions[key]
}

// env is a limiter behind a real listener, in front of a real upstream
// handler that counts its requests.
type env struct {
	t     *testing.T
	srv   *httptest.Server
	lim   *httplimit.Limiter
	clock *testclock.Clock // shared by the limiter and the test: no test sleeps
	obs   *observer
	store store.Store
	hits  atomic.Int64
}

func parse(t *testing.T, src string) *rules.Set {
	t.Helper()
	set, err := rules.Parse([]byte(src), filepath.Join(t.TempDir(), "rules.json"))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func newEnv(t *testing.T, store store.Store, set *rules.Set, opts ...httplimit.Option) *env {
	t.Helper()
	e := &env{t: t, clock: testclock.New(), obs: &observer{}, store: store}
	if e.store == nil {
		ms := memstore.New()
		t.Cleanup(func() { ms.Close() })
		e.store = ms
	}
	// A generous store deadline: the middleware's 50 ms default on a
	// loaded machine would let on_error decide (the deadline tests set
	// their own).
	opts = append([]httplimit.Option{engine.WithTimeout(teststores.Timeout), engine.WithClock(e.clock.Now), engine.WithObserver(e.obs),
		engine.WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	e.lim = httplimit.New(e.store, set, opts...)
	t.Cleanup(func() { e.lim.Close() })
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.hits.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "hello %s\n", r.URL.Path)
	})
	e.srv = httptest.NewServer(e.lim.Handler(upstream))
	t.Cleanup(e.srv.Close)
	return e
}

type resp struct {
	code int
	h    http.Header
	body string
}

// do sends a GET with the given headers ("Name: value").
func (e *env) do(path string, headers ...string) resp {
	e.t.Helper()
	req, err := http.NewRequest("GET", e.srv.URL+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Add(k, strings.TrimSpace(v))
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{res.StatusCode, res.Header, string(b)}
}

func (r resp) remaining(t *testing.T) int {
	t.Helper()
	n, err := strconv.Atoi(r.h.Get("RateLimit-Remaining"))
	if err != nil {
		t.Fatalf("RateLimit-Remaining %q (status %d, headers %v)", r.h.Get("RateLimit-Remaining"), r.code, r.h)
	}
	return n
}

func (r resp) problem(t *testing.T) httplimit.Problem {
	t.Helper()
	if ct := r.h.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var p httplimit.Problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	if p.Status != r.code || p.Title != http.StatusText(r.code) || p.Type != "about:blank" || p.Detail == "" {
		t.Fatalf("problem %+v for status %d", p, r.code)
	}
	return p
}

const freeRules = `{"rules": [
	{"name": "free", "limit_keys": ["header:x-api-key"],
	 "algorithm": "token_bucket", "algorithm_config": {"rps": 10, "burst": 20}}]}`

func TestHeadersExact(t *testing.T) {
	e := newEnv(t, nil, parse(t, freeRules))
	r := e.do("/", "X-Api-Key: k1")
	want := map[string]string{
		"RateLimit-Policy":    `"free";q=20;w=2`,
		"RateLimit":           `"free";r=19;t=1`,
		"RateLimit-Limit":     "20",
		"RateLimit-Remaining": "19",
		"RateLimit-Reset":     "1",
		"Retry-After":         "",
	}
	for k, v := range want {
		if got := r.h.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	if r.code != 200 || r.body != "hello /\n" {
		t.Fatalf("%d %q", r.code, r.body)
	}
	for range 12 {
		e.do("/", "X-Api-Key: k1")
	}
	// The headers' worked example: 13 taken of 20 at 10/s, full again in 1.3 s.
	r = e.do("/", "X-Api-Key: k1")
	if got := r.h.Get("RateLimit"); got != `"free";r=6;t=2` {
		t.Errorf("RateLimit %q", got)
	}
	e.clock.Add(100 * time.Millisecond) // one token back, exactly
	r = e.do("/", "X-Api-Key: k1")
	if r.remaining(t) != 6 || r.h.Get("RateLimit") != `"free";r=6;t=2` {
		t.Errorf("after 0.1 s: %v", r.h)
	}
	// A request without the key is not limited by the rule: no headers.
	r = e.do("/")
	if r.code != 200 || r.h.Get("RateLimit") != "" || r.h.Get("RateLimit-Policy") != "" {
		t.Errorf("keyless request: %d %v", r.code, r.h)
	}
}

func Test429AfterBurst(t *testing.T) {
	e := newEnv(t, nil, parse(t, freeRules))
	for i := range 20 {
		if r := e.do("/", "X-Api-Key: k1"); r.code != 200 || r.remaining(t) != 19-i {
			t.Fatalf("request %d: %d remaining %s", i, r.code, r.h.Get("RateLimit-Remaining"))
		}
	}
	r := e.do("/", "X-Api-Key: k1")
	if r.code != 429 {
		t.Fatalf("21st request: %d", r.code)
	}
	ra, err := strconv.Atoi(r.h.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 2 { // raw ceil(0.1 s) = 1, jitter up to 50% rounded up
		t.Fatalf("Retry-After %q", r.h.Get("Retry-After"))
	}
	if got, want := r.h.Get("RateLimit"), fmt.Sprintf(`"free";r=0;t=%d`, ra); got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	if r.h.Get("RateLimit-Reset") != strconv.Itoa(ra) || r.remaining(t) != 0 || r.h.Get("RateLimit-Policy") != `"free";q=20;w=2` {
		t.Errorf("headers %v", r.h)
	}
	p := r.problem(t)
	if p.Rule != "free" || p.Reason != engine.ReasonTokenBucket || p.RetryAfter != int64(ra) {
		t.Errorf("problem %+v", p)
	}
	if e.hits.Load() != 20 {
		t.Errorf("upstream saw %d requests, want 20", e.hits.Load())
	}
	// Another key has its own bucket.
	if r := e.do("/", "X-Api-Key: k2"); r.code != 200 {
		t.Errorf("k2: %d", r.code)
	}
	e.clock.Add(100 * time.Millisecond)
	if r := e.do("/", "X-Api-Key: k1"); r.code != 200 || r.remaining(t) != 0 {
		t.Errorf("after refill: %d %v", r.code, r.h)
	}
	if e.obs.count("free/enforce/denied") != 1 || e.obs.count("free/enforce/allowed") != 22 {
		t.Errorf("observed %v", e.obs.decisions)
	}
}

func TestFixedWindow(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"rules": [{"name": "fw", "limit_keys": ["global"], "algorithm": "fixed_window",
		"algorithm_config": {"rate": 3, "period": "10s", "start": 0}}]}`))
	e.clock.Set(time.Unix(1_000_000_002, 0)) // 2 s into a 10 s window aligned on the epoch
	for range 3 {
		if r := e.do("/"); r.code != 200 || r.h.Get("RateLimit-Policy") != `"fw";q=3;w=10` {
			t.Fatalf("%d %v", r.code, r.h)
		}
	}
	r := e.do("/")
	if r.code != 429 || r.problem(t).Reason != engine.ReasonFixedWindow {
		t.Fatalf("%d %s", r.code, r.body)
	}
	ra, _ := strconv.Atoi(r.h.Get("Retry-After"))
	if ra < 8 || ra > 12 { // the window ends in 8 s
		t.Errorf("Retry-After %d", ra)
	}
}

// TestRetryAfterJitterCapped: a one-request-a-day rule answers at most
// 60 s of jitter on top of the day by default, and the rules file's
// retry_after_jitter sets another cap; each client keeps its own value.
func TestRetryAfterJitterCapped(t *testing.T) {
	for _, c := range []struct {
		setting string
		max     int
	}{
		{"", 60},
		{`"retry_after_jitter": {"fraction": 0.5, "max": "5s"},`, 5},
	} {
		e := newEnv(t, nil, parse(t, `{"trusted_proxies": ["127.0.0.1", "::1"], `+c.setting+`
			"rules": [{"name": "daily", "limit_keys": ["ip:address"],
			"algorithm_config": {"rate": 1, "period": "24h", "burst": 1}}]}`))
		seen := map[string]bool{}
		for i := range 20 {
			ip := fmt.Sprintf("203.0.113.%d", i+1)
			e.do("/", "X-Forwarded-For: "+ip)
			r := e.do("/", "X-Forwarded-For: "+ip)
			n, err := strconv.Atoi(r.h.Get("Retry-After"))
			if r.code != 429 || err != nil || n < 86400 || n > 86400+c.max {
				t.Fatalf("%s %s: %d Retry-After %q, want within [86400, %d]", c.setting, ip, r.code, r.h.Get("Retry-After"), 86400+c.max)
			}
			if again := e.do("/", "X-Forwarded-For: "+ip); again.h.Get("Retry-After") != r.h.Get("Retry-After") {
				t.Errorf("%s: Retry-After %s then %s for one client", ip, r.h.Get("Retry-After"), again.h.Get("Retry-After"))
			}
			seen[r.h.Get("Retry-After")] = true
		}
		if len(seen) < 3 {
			t.Errorf("%s: 20 clients got %d distinct Retry-After values", c.setting, len(seen))
		}
	}
}

// clientIP sends requests as if from client ip: the test listener trusts
// its own loopback peer as a proxy, which appends the client.
func TestRetryAfterJitter(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"trusted_proxies": ["127.0.0.1", "::1"],
		"rules": [{"name": "slow", "limit_keys": ["ip:address"],
		"algorithm_config": {"rate": 1, "period": "1m", "burst": 1}}]}`))
	seen := map[string]bool{}
	for i := range 20 {
		ip := fmt.Sprintf("203.0.113.%d", i+1)
		if r := e.do("/", "X-Forwarded-For: "+ip); r.code != 200 {
			t.Fatalf("%s first: %d", ip, r.code)
		}
		var first string
		for j := range 3 {
			r := e.do("/", "X-Forwarded-For: "+ip)
			ra := r.h.Get("Retry-After")
			n, _ := strconv.Atoi(ra)
			if r.code != 429 || n < 60 || n > 90 {
				t.Fatalf("%s: %d Retry-After %q, want within [60, 90]", ip, r.code, ra)
			}
			if want := (rules.Jitter{Fraction: 0.5, Max: math.MaxInt64}).Seconds("ip:"+ip, time.Minute); int64(n) != want {
				t.Errorf("%s: Retry-After %d, want %d", ip, n, want)
			}
			if j == 0 {
				first = ra
			} else if ra != first {
				t.Errorf("%s: Retry-After %s then %s: the same client must hear the same", ip, first, ra)
			}
		}
		seen[first] = true
	}
	if len(seen) < 8 {
		t.Errorf("20 clients got only %d distinct Retry-After values: %v", len(seen), seen)
	}
}

func TestCost(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"rules": [{"name": "weighted", "limit_keys": ["header:x-api-key"],
		"algorithm_config": {"rate": 1, "period": "1h", "burst": 30,
		"cost_source": "header:x-weight", "default_cost": 2}}]}`))
	tokens := 30.0
	for _, c := range []struct {
		weight string
		cost   float64
	}{
		{"5", 5}, {"2.5", 2.5}, {"abc", 2}, {"-3", 2}, {"", 2}, {"NaN", 2}, {"Inf", 2}, {"1e3", 2}, {"0x10", 2},
		{"1", 1}, {"0", 0}, {"+1", 2}, {"5,5", 2},
	} {
		h := []string{"X-Api-Key: k"}
		if c.weight != "" {
			h = append(h, "X-Weight: "+c.weight)
		}
		tokens -= c.cost
		r := e.do("/", h...)
		if want := int(tokens); r.code != 200 || r.remaining(t) != want {
			t.Fatalf("weight %q: %d remaining %d, want %d", c.weight, r.code, r.remaining(t), want)
		}
	}
	// A cost above the burst can never pass: 429, not a 500, and nothing taken.
	e2 := newEnv(t, nil, parse(t, `{"rules": [{"name": "q", "limit_keys": ["global"],
		"algorithm_config": {"rps": 10, "burst": 20, "cost_source": "query:cost"}}]}`))
	r := e2.do("/?cost=25")
	if r.code != 429 || r.h.Get("Retry-After") != "" {
		t.Fatalf("cost 25: %d Retry-After %q", r.code, r.h.Get("Retry-After"))
	}
	if p := r.problem(t); p.Reason != engine.ReasonCostExceedsBurst || p.Rule != "q" {
		t.Errorf("problem %+v", p)
	}
	if r.remaining(t) != 20 || r.h.Get("RateLimit") != `"q";r=20;t=0` {
		t.Errorf("headers %v", r.h)
	}
	if r := e2.do("/?cost=7"); r.code != 200 || r.remaining(t) != 13 {
		t.Errorf("cost 7: %d %v", r.code, r.h)
	}
	if r := e2.do("/?cost=x"); r.code != 200 || r.remaining(t) != 12 {
		t.Errorf("cost x (default 1): %d %v", r.code, r.h)
	}
}

func TestSpoofedForwardedFor(t *testing.T) {
	for _, c := range []struct {
		name    string
		proxies string
		spoofed bool // whether X-Forwarded-For picks the bucket
	}{
		{"no trusted proxies", ``, false},
		{"peer not trusted", `"trusted_proxies": ["10.0.0.0/8"],`, false},
		{"peer trusted", `"trusted_proxies": ["127.0.0.0/8", "::1"],`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil, parse(t, `{`+c.proxies+`"rules": [{"name": "per-ip", "limit_keys": ["ip:address"],
				"algorithm_config": {"rps": 1, "burst": 5}}]}`))
			e.do("/", "X-Forwarded-For: 198.51.100.1")
			r := e.do("/", "X-Forwarded-For: 198.51.100.2")
			r2 := e.do("/", "X-Forwarded-For: 198.51.100.2, 127.0.0.1")
			if c.spoofed {
				if r.remaining(t) != 4 || r2.remaining(t) != 3 {
					t.Errorf("trusted: remaining %d then %d, want 4 then 3", r.remaining(t), r2.remaining(t))
				}
			} else if r.remaining(t) != 3 || r2.remaining(t) != 2 {
				t.Errorf("untrusted: remaining %d then %d, want one bucket: 3 then 2", r.remaining(t), r2.remaining(t))
			}
		})
	}
}

func TestGroupsMatchAndAllOrNothing(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"rules": [
		{"name": "admin", "group": "tier", "limit_keys": ["header:x-api-key"], "match": {"header:x-role": "admin"},
		 "algorithm_config": {"rps": 100, "burst": 100}},
		{"name": "user", "group": "tier", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rps": 1, "burst": 3}},
		{"name": "anon", "group": "tier", "limit_keys": ["ip:address"], "algorithm_config": {"rps": 1, "burst": 2}},
		{"name": "api", "limit_keys": ["ip:address"], "match": {"path": "/api/*", "method": ["GET", "HEAD"]},
		 "algorithm_config": {"rps": 1, "burst": 5}}]}`))
	policies := func(r resp) string { return r.h.Get("RateLimit-Policy") }
	if got := policies(e.do("/x", "X-Api-Key: k", "X-Role: admin")); got != `"admin";q=100;w=1` {
		t.Errorf("admin: %q", got)
	}
	if got := policies(e.do("/x", "X-Api-Key: k")); got != `"user";q=3;w=3` {
		t.Errorf("user: %q", got)
	}
	// No key: the user rule does not apply, the next one of the group does.
	if got := policies(e.do("/x")); got != `"anon";q=2;w=2` {
		t.Errorf("anon: %q", got)
	}
	// Every matching rule applies: user and api; "/api/../x" is "/x".
	if got := policies(e.do("/api/v1", "X-Api-Key: k2")); got != `"user";q=3;w=3, "api";q=5;w=5` {
		t.Errorf("user+api: %q", got)
	}
	if got := policies(e.do("/api/../x", "X-Api-Key: k2")); got != `"user";q=3;w=3` {
		t.Errorf("cleaned path: %q", got)
	}
	// k2 has 1 left, api 4. Two more: the first takes both, the second is
	// denied by user and must not take from api.
	r := e.do("/api/v1", "X-Api-Key: k2")
	if r.code != 200 || r.h.Get("RateLimit") != `"user";r=0;t=3, "api";r=3;t=2` || r.h.Get("RateLimit-Limit") != "3" {
		t.Fatalf("%d %v", r.code, r.h)
	}
	r = e.do("/api/v1", "X-Api-Key: k2")
	if r.code != 429 || r.problem(t).Rule != "user" {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if got := r.h.Get("RateLimit"); !strings.HasSuffix(got, `, "api";r=3;t=2`) {
		t.Errorf("RateLimit on 429 %q: api must keep 3", got)
	}
	r = e.do("/api/v1", "X-Api-Key: k3")
	if r.code != 200 || !strings.Contains(r.h.Get("RateLimit"), `"api";r=2;`) || r.h.Get("RateLimit-Limit") != "5" || r.remaining(t) != 2 {
		t.Errorf("api after the denial: %v", r.h)
	}
	if e.obs.count("api/enforce/not_taken") != 1 {
		t.Errorf("observed %v", e.obs.decisions)
	}
}

func TestShadow(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"rules": [
		{"name": "strict", "limit_keys": ["ip:address"], "algorithm_config": {"rps": 1, "burst": 3}},
		{"name": "watch", "mode": "shadow", "limit_keys": ["global"], "algorithm_config": {"rps": 1, "burst": 2}}]}`))
	for i := range 3 {
		r := e.do("/")
		if r.code != 200 || strings.Contains(r.h.Get("RateLimit-Policy"), "watch") {
			t.Fatalf("request %d: %d %v", i, r.code, r.h)
		}
	}
	// The shadow rule denied the third request without blocking it.
	if e.obs.count("watch/shadow/denied") != 1 || e.obs.count("watch/shadow/allowed") != 2 {
		t.Errorf("observed %v", e.obs.decisions)
	}
	// Denied by strict: the shadow rule is only peeked, not drained.
	if r := e.do("/"); r.code != 429 {
		t.Fatalf("%d", r.code)
	}
	if e.obs.count("watch/shadow/denied") != 2 {
		t.Errorf("observed %v", e.obs.decisions)
	}
	e.clock.Add(time.Second)
	d, err := storetest.Apply(context.Background(), e.store, bucket.Peek, e.clock.Now(), drip.Request{Key: "watch", Limit: drip.PerSecond(1).WithBurst(2), Cost: 0})
	if err != nil || d.Tokens != 1 {
		t.Errorf("shadow bucket %+v %v: want 1 token", d, err)
	}
}

func TestSwapKeepsBuckets(t *testing.T) {
	e := newEnv(t, nil, parse(t, freeRules))
	for range 5 {
		e.do("/", "X-Api-Key: k")
	}
	e.lim.Swap(parse(t, `{"rules": [
		{"name": "other", "limit_keys": ["global"], "mode": "shadow", "algorithm_config": {"rps": 1}},
		{"name": "free", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rps": 10, "burst": 20}}]}`))
	if r := e.do("/", "X-Api-Key: k"); r.remaining(t) != 14 {
		t.Errorf("after swap remaining %d, want 14", r.remaining(t))
	}
	if e.lim.Rules().Rules[0].Name != "other" {
		t.Error("Rules() is not the swapped set")
	}
}

// downStore is a store that is down: every call fails (until up is set).
type downStore struct {
	up    atomic.Bool
	calls atomic.Int64
	store.Store
}

var errDown = errors.New("connection refused")

func (s *downStore) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	s.calls.Add(1)
	if s.up.Load() {
		return s.Store.Apply(ctx, op, at, items, results)
	}
	return errDown
}

// Caps are the store's, but not InProcess: it stands for a store on a
// server, whose calls get a deadline.
func (d *downStore) Caps() store.Caps {
	c := d.Store.Caps()
	c.InProcess = false
	return c
}

// slowStore never answers before the deadline.
type slowStore struct{ store.Store }

func (slowStore) Apply(ctx context.Context, _ bucket.Op, _ time.Time, _ []bucket.Prepared, _ []bucket.Result) error {
	<-ctx.Done()
	return ctx.Err()
}

func (slowStore) Caps() store.Caps { return store.Caps{} }

func downRules(policy string) string {
	return `{"on_error": "` + policy + `", "local_share": 0.5, "circuit_breaker": {"failures": 3, "cooldown": "10s"},
		"rules": [{"name": "free", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rps": 10, "burst": 20}}]}`
}

func TestStoreDownAllow(t *testing.T) {
	ds := &downStore{Store: memstore.New()}
	e := newEnv(t, ds, parse(t, downRules("allow")))
	for range 30 {
		r := e.do("/", "X-Api-Key: k")
		if r.code != 200 || r.h.Get("RateLimit") != "" {
			t.Fatalf("%d %v", r.code, r.h)
		}
	}
	if e.hits.Load() != 30 || e.obs.count("free/enforce/error_allowed") != 30 {
		t.Errorf("hits %d, observed %v", e.hits.Load(), e.obs.decisions)
	}
	// The breaker opened after 3 failures: the store was not called again.
	if ds.calls.Load() != 3 || e.obs.errs() != 3 || e.lim.BreakerState() != engine.BreakerOpen {
		t.Errorf("store calls %d, errors %d, breaker %s", ds.calls.Load(), e.obs.errs(), e.lim.BreakerState())
	}
	// After the cool-down one probe goes through; the store is back.
	ds.up.Store(true)
	e.clock.Add(10 * time.Second)
	if r := e.do("/", "X-Api-Key: k"); r.code != 200 || r.remaining(t) != 19 {
		t.Errorf("after recovery: %d %v", r.code, r.h)
	}
	if e.lim.BreakerState() != engine.BreakerClosed || ds.calls.Load() != 4 {
		t.Errorf("breaker %s, calls %d", e.lim.BreakerState(), ds.calls.Load())
	}
	if got := strings.Join(e.obs.states, ","); got != "open,half_open,closed" {
		t.Errorf("breaker states %q", got)
	}
}

// TestBreakerProbeCallerGaveUp: when the caller of the half-open probe
// gives up, the store is not to blame: the breaker stays half-open and the
// next request probes, instead of a whole new cool-down.
func TestBreakerProbeCallerGaveUp(t *testing.T) {
	ds := &downStore{Store: memstore.New()}
	e := newEnv(t, ds, parse(t, downRules("allow")))
	for range 3 {
		e.do("/", "X-Api-Key: k")
	}
	if e.lim.BreakerState() != engine.BreakerOpen {
		t.Fatalf("breaker %s", e.lim.BreakerState())
	}
	e.clock.Add(10 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("X-Api-Key", "k")
	if res := e.lim.Decide(ctx, req); res.Err == nil {
		t.Fatalf("the probe with a cancelled caller: %+v", res)
	}
	if ds.calls.Load() != 4 || e.lim.BreakerState() != engine.BreakerHalfOpen {
		t.Fatalf("after the abandoned probe: calls %d, breaker %s", ds.calls.Load(), e.lim.BreakerState())
	}
	ds.up.Store(true)
	if r := e.do("/", "X-Api-Key: k"); r.code != 200 || ds.calls.Load() != 5 || e.lim.BreakerState() != engine.BreakerClosed {
		t.Fatalf("next request: %d, calls %d, breaker %s", r.code, ds.calls.Load(), e.lim.BreakerState())
	}
}

func TestStoreDownDeny(t *testing.T) {
	ds := &downStore{Store: memstore.New()}
	e := newEnv(t, ds, parse(t, downRules("deny")))
	r := e.do("/", "X-Api-Key: k")
	if r.code != 503 {
		t.Fatalf("%d", r.code)
	}
	if p := r.problem(t); p.Reason != engine.ReasonStoreUnavailable || p.Rule != "free" ||
		p.RetryAfter != 1 || !strings.Contains(p.Detail, "store_timeout") {
		t.Errorf("problem %+v", p)
	}
	// The breaker probes the store within its cool-down: ask again soon.
	if got := r.h.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q, want 1", got)
	}
	if e.hits.Load() != 0 || e.obs.count("free/enforce/error_denied") != 1 {
		t.Errorf("hits %d, observed %v", e.hits.Load(), e.obs.decisions)
	}
	// A request no rule applies to does not need the store.
	if r := e.do("/"); r.code != 200 {
		t.Errorf("keyless: %d", r.code)
	}
}

func TestStoreDownLocal(t *testing.T) {
	ds := &downStore{Store: memstore.New()}
	e := newEnv(t, ds, parse(t, downRules("local")))
	for i := range 10 { // half the burst of 20
		r := e.do("/", "X-Api-Key: k")
		if r.code != 200 || r.h.Get("RateLimit-Policy") != `"free";q=10;w=2` || r.remaining(t) != 9-i {
			t.Fatalf("request %d: %d %v", i, r.code, r.h)
		}
	}
	r := e.do("/", "X-Api-Key: k")
	if r.code != 429 || r.problem(t).Reason != engine.ReasonTokenBucket {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if ra, _ := strconv.Atoi(r.h.Get("Retry-After")); ra < 1 || ra > 2 { // 5/s locally: 0.2 s
		t.Errorf("Retry-After %q", r.h.Get("Retry-After"))
	}
	if r := e.do("/", "X-Api-Key: other"); r.code != 200 {
		t.Errorf("other key: %d", r.code)
	}
	if ds.calls.Load() != 3 || e.obs.count("free/enforce/local_allowed") != 11 || e.obs.count("free/enforce/local_denied") != 1 {
		t.Errorf("calls %d, observed %v", ds.calls.Load(), e.obs.decisions)
	}
	// A failed probe opens the breaker again for a whole cool-down.
	e.clock.Add(10 * time.Second)
	e.do("/", "X-Api-Key: k")
	e.do("/", "X-Api-Key: k")
	if ds.calls.Load() != 4 || e.lim.BreakerState() != engine.BreakerOpen {
		t.Errorf("calls %d, breaker %s", ds.calls.Load(), e.lim.BreakerState())
	}
}

// deadlineStore is a slowStore that records the longest time left to a
// call's deadline when the call arrives.
type deadlineStore struct {
	slowStore
	mu      sync.Mutex
	calls   int
	longest time.Duration
	none    bool // a call without a deadline
}

func (s *deadlineStore) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	s.mu.Lock()
	s.calls++
	if d, ok := ctx.Deadline(); ok {
		s.longest = max(s.longest, time.Until(d))
	} else {
		s.none = true
	}
	s.mu.Unlock()
	return s.slowStore.Apply(ctx, op, at, items, results)
}

func TestStoreDeadline(t *testing.T) {
	// In a synctest bubble: a deadline error that came back late (a
	// loaded machine) would count as this process's slowness, not the
	// store's silence.
	synctest.Test(t, func(t *testing.T) {
		st := &deadlineStore{}
		obs := &observer{}
		lim := httplimit.New(st, parse(t, downRules("allow")), engine.WithTimeout(20*time.Millisecond),
			engine.WithObserver(obs), engine.WithLogger(slog.New(slog.DiscardHandler)))
		defer lim.Close()
		h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		for range 5 {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-Api-Key", "k")
			if h.ServeHTTP(rec, req); rec.Code != 200 {
				t.Fatalf("%d", rec.Code)
			}
		}
		// 3 calls time out with the store silent, then the breaker skips
		// the store. Each call had at most the 20 ms deadline left (time
		// only shortens it).
		if st.calls != 3 || st.none || st.longest > 20*time.Millisecond {
			t.Errorf("%d store calls had up to %v left to their deadline (none: %v), want 3 with at most 20ms", st.calls, st.longest, st.none)
		}
		if obs.errs() != 3 || obs.count("free/enforce/error_allowed") != 5 {
			t.Errorf("errors %d, observed %v", obs.errs(), obs.decisions)
		}
	})
	// The rules file's store_timeout wins over the option.
	set := parse(t, `{"store_timeout": "5ms", "rules": [{"name": "g", "limit_keys": ["global"], "algorithm_config": {"rps": 1}}]}`)
	l := httplimit.New(slowStore{}, set, engine.WithTimeout(time.Hour), engine.WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	req := httptest.NewRequest("GET", "/", nil)
	if res := l.Decide(context.Background(), req); !res.Allowed || !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Errorf("Decide: %+v", res)
	}
}

func TestDecideWithoutRules(t *testing.T) {
	l := httplimit.New(memstore.New(), parse(t, `{"rules": []}`))
	defer l.Close()
	res := l.Decide(context.Background(), httptest.NewRequest("GET", "/", nil))
	if !res.Allowed || res.Top != nil || len(res.Applied) != 0 {
		t.Errorf("%+v", res)
	}
	rec := httptest.NewRecorder()
	httplimit.WriteHeaders(rec.Header(), res)
	if len(rec.Header()) != 0 {
		t.Errorf("headers %v", rec.Header())
	}
	// A nil set is the built-in default.
	d := httplimit.New(memstore.New(), nil)
	defer d.Close()
	if d.Rules().Rules[0].Name != "per-ip" {
		t.Errorf("default rules %v", d.Rules().Rules)
	}
}

func TestMain(m *testing.M) {
	// The JWT tests read their HMAC secret from the environment.
	os.Setenv("DRIP_TEST_JWT_SECRET", hmacSecret)
	testserver.Main(m)
}

func (o *observer) errs() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.errors
}

// When the store fails for the enforce rules, the shadow rules do not
// call it again: one deadline per request at most.
func TestStoreDownShadowSkipped(t *testing.T) {
	ds := &downStore{Store: memstore.New()}
	e := newEnv(t, ds, parse(t, `{"rules": [
		{"name": "e", "limit_keys": ["global"], "algorithm_config": {"rps": 1}},
		{"name": "s", "mode": "shadow", "limit_keys": ["global"], "algorithm_config": {"rps": 1}}]}`))
	if r := e.do("/"); r.code != 200 || ds.calls.Load() != 1 {
		t.Fatalf("%d, %d store calls", r.code, ds.calls.Load())
	}
	if e.obs.count("s/shadow/error_allowed") != 1 || e.obs.count("e/enforce/error_allowed") != 1 {
		t.Errorf("observed %v", e.obs.decisions)
	}
}

// TestPathDotSegments: a last segment "." or ".." leaves a directory, as
// RFC 3986 removes dot segments and nginx routes them: "/api/v1/.." is
// "/api/", which nginx sends to a location /api/, so the api rule
// applies; "/api/.." is "/".
func TestPathDotSegments(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"rules": [
		{"name": "api", "limit_keys": ["ip:address"], "match": {"path": "/api/*"}, "algorithm_config": {"rps": 1, "burst": 100}},
		{"name": "all", "limit_keys": ["ip:address"], "algorithm_config": {"rps": 1, "burst": 100}}]}`))
	for _, p := range []string{"/api/", "/api/.", "/api/v1/..", "/api/v1/%2e%2e", "/api/v1/./..", "/x/../api/.", "/api/v1/../"} {
		if got := e.do(p).h.Get("RateLimit-Policy"); !strings.HasPrefix(got, `"api"`) {
			t.Errorf("%s: policies %q, want the api rule to apply", p, got)
		}
	}
	for _, p := range []string{"/api", "/api/..", "/api/v1/../..", "/api.", "/api/../x/."} {
		if got := e.do(p).h.Get("RateLimit-Policy"); strings.HasPrefix(got, `"api"`) {
			t.Errorf("%s: policies %q, want the api rule not to apply", p, got)
		}
	}
}

// TestKeysFitWrappedStore: behind a store wrapper that lengthens keys
// (store.Prefixed, store.Sharded), no request can choose its values so that
// its bucket key is refused as too long, which would count as the store
// failing and let on_error (allow) pass it unlimited. Here the values make
// a rule key of every length around the old bound, 1,024 bytes.
func TestKeysFitWrappedStore(t *testing.T) {
	ms := memstore.New()
	t.Cleanup(func() { ms.Close() })
	for _, st := range []store.Store{
		store.Prefixed{Store: ms, Prefix: strings.Repeat("p", 64) + ":"},
		store.Sharded{Store: store.Prefixed{Store: ms, Prefix: "s:"}, N: 4},
	} {
		e := newEnv(t, st, parse(t, `{"rules": [{"name": "r", "on_error": "allow",
		  "limit_keys": ["header:a", "header:b", "header:c", "header:d"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 4}}]}`))
		v := strings.Repeat("|", 127) // 254 bytes escaped
		for n := 100; n <= 127; n++ {
			// "r" and four values, "|" before each: 1 + 4 + 3*254 + 2n bytes.
			hdr := []string{"A: " + v, "B: " + v, "C: " + v, "D: " + v[:n]}
			for i := range 5 {
				// A failed store call would answer 200 without headers.
				r := e.do("/", hdr...)
				if r.h.Get("RateLimit") == "" {
					t.Fatalf("%T, key of %d bytes, request %d: %d %v: want it decided by the store", st, 767+2*n, i+1, r.code, r.h)
				}
				if _, sharded := st.(store.Sharded); !sharded && (r.code == 429) != (i == 4) {
					t.Fatalf("%T, key of %d bytes, request %d: %d, want the burst of 4 allowed", st, 767+2*n, i+1, r.code)
				}
			}
		}
	}
}
