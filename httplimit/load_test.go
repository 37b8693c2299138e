package httplimit_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// Concurrent requests over two rules grant exactly what the tighter one
// allows, and a denied request takes from neither, while the rules are
// swapped (a reload) again and again: no bucket state is lost.
func TestConcurrentAllOrNothingUnderReload(t *testing.T) {
	src := `{"rules": [
		{"name": "key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 50}},
		{"name": "all", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 80}}]}`
	e := newEnv(t, nil, parse(t, src))
	var allowed, denied atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	go func() { // reload continuously, in the other rule order
		alt := parse(t, `{"rules": [
			{"name": "all", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 80}},
			{"name": "key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 50}}]}`)
		orig := e.lim.Rules()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				e.lim.Swap(alt)
			} else {
				e.lim.Swap(orig)
			}
		}
	}()
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "X-Api-Key: a"
			if w%2 == 1 {
				key = "X-Api-Key: b"
			}
			for range 15 {
				switch r := e.do("/", key); r.code {
				case 200:
					allowed.Add(1)
				case 429:
					denied.Add(1)
				default:
					t.Errorf("status %d", r.code)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	// 120 requests, 60 per key: each key is held to 50, and all of them
	// to 80: 80 granted, whatever the interleaving.
	if allowed.Load() != 80 || denied.Load() != 40 || e.hits.Load() != 80 {
		t.Errorf("allowed %d, denied %d, upstream %d; want 80, 40, 80", allowed.Load(), denied.Load(), e.hits.Load())
	}
}

func TestIPv6Prefix(t *testing.T) {
	for _, c := range []struct {
		prefix string
		shared bool // whether two addresses of one /64 share a bucket
	}{{``, true}, {`"ipv6_prefix": 128,`, false}} {
		set := parse(t, `{`+c.prefix+`"rules": [{"name": "ip", "limit_keys": ["ip:address"], "algorithm_config": {"rps": 1, "burst": 5}}]}`)
		l := httplimit.New(memstore.New(), set)
		var last int64
		for _, addr := range []string{"[2001:db8:1:2::1]:5000", "[2001:db8:1:2:ffff::9]:5001"} {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = addr
			res := l.Decide(context.Background(), r)
			last = res.Top.Decision.Remaining
		}
		if (last == 3) != c.shared {
			t.Errorf("prefix %q: remaining %d after two addresses of one /64", c.prefix, last)
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "[2001:db8:1:3::1]:5000"
		if res := l.Decide(context.Background(), r); res.Top.Decision.Remaining != 4 {
			t.Errorf("another /64 shares the bucket")
		}
		l.Close()
	}
}

// oneKeyStore takes one key per call, like Redis Cluster across slots.
type oneKeyStore struct{ *memstore.Store }

func (s oneKeyStore) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if len(items) > 1 {
		return fmt.Errorf("keys of a multi-take must share a hash slot: %w", store.ErrNotColocated)
	}
	return s.Store.Apply(ctx, op, at, items, results)
}

// TestSeparateTakes: with WithSeparateTakes the rules are taken one store
// call each, and the answers (statuses, headers) are those of a store that
// takes them in one atomic step.
func TestSeparateTakes(t *testing.T) {
	ms := memstore.New()
	defer ms.Close()
	e := newEnv(t, oneKeyStore{ms}, parse(t, `{"rules": [
		{"name": "ip", "limit_keys": ["ip:address"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 10}},
		{"name": "key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 2}},
		{"name": "all", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 100}}]}`),
		engine.WithSeparateTakes())
	atomic := newEnv(t, nil, e.lim.Rules())
	same := func(what string, h ...string) resp {
		t.Helper()
		r, a := e.do("/", h...), atomic.do("/", h...)
		if r.code != a.code || r.h.Get("RateLimit") != a.h.Get("RateLimit") || r.h.Get("RateLimit-Policy") != a.h.Get("RateLimit-Policy") {
			t.Fatalf("%s: one by one %d %q, in one step %d %q", what, r.code, r.h.Get("RateLimit"), a.code, a.h.Get("RateLimit"))
		}
		return r
	}
	for range 2 {
		if r := same("allowed", "X-Api-Key: a"); r.code != 200 || r.h.Get("RateLimit") == "" {
			t.Fatalf("%d %v", r.code, r.h)
		}
	}
	// key denies: ip was taken, then given back; all is peeked at.
	r := same("key denies", "X-Api-Key: a")
	if r.code != 429 || r.problem(t).Rule != "key" {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if got := r.h.Get("RateLimit"); !strings.HasPrefix(got, `"ip";r=8;`) || !strings.Contains(got, `"all";r=98;`) {
		t.Errorf("RateLimit on 429: %q", got)
	}
	r = same("after the denial", "X-Api-Key: b")
	if r.code != 200 || !strings.HasPrefix(r.h.Get("RateLimit"), `"ip";r=7;`) || !strings.Contains(r.h.Get("RateLimit"), `"all";r=97;`) {
		t.Errorf("after the denial: %v", r.h)
	}
	if e.obs.errs() != 0 {
		t.Errorf("%d store errors", e.obs.errs())
	}
	// Without the option, the store's store.ErrNotColocated switches the
	// limiter to separate takes by itself: no store error, no breaker, and
	// the same all-or-nothing answers.
	e2 := newEnv(t, oneKeyStore{ms}, e.lim.Rules())
	for range 2 {
		if r := e2.do("/", "X-Api-Key: c"); r.code != 200 {
			t.Fatalf("without WithSeparateTakes: %d", r.code)
		}
	}
	if r := e2.do("/", "X-Api-Key: c"); r.code != 429 || r.problem(t).Rule != "key" {
		t.Fatalf("without WithSeparateTakes, the third request: %d %s", r.code, r.body)
	}
	if r := e2.do("/", "X-Api-Key: d"); r.code != 200 || !strings.HasPrefix(r.h.Get("RateLimit"), `"ip";r=4;`) {
		t.Errorf("without WithSeparateTakes, the denial was not refunded: %v", r.h)
	}
	if e2.obs.errs() != 0 {
		t.Errorf("without WithSeparateTakes: %d store errors", e2.obs.errs())
	}
}

// Cookies, query parameters and claims of every scalar type as keys and
// matches; numbers and booleans compare as text.
func TestSources(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"jwt": {"verify": false}, "rules": [
		{"name": "c", "limit_keys": ["cookie:sid", "query:tenant"], "match": {"jwt:tier": 3, "jwt:beta": true},
		 "algorithm_config": {"rps": 1, "burst": 5}}]}`))
	tok := func(tier any, beta any) string {
		s, _ := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"tier": tier, "beta": beta}).SignedString(jwt.UnsafeAllowNoneSignatureType)
		return "Authorization: Bearer " + s
	}
	if r := e.do("/?tenant=t1", "Cookie: sid=s1", tok(3, true)); r.h.Get("RateLimit") != `"c";r=4;t=1` {
		t.Errorf("match: %v", r.h)
	}
	if r := e.do("/?tenant=t1", "Cookie: sid=s1", tok(3, true)); r.remaining(t) != 3 {
		t.Errorf("same bucket: %v", r.h)
	}
	if r := e.do("/?tenant=t2", "Cookie: sid=s1", tok(3, true)); r.remaining(t) != 4 {
		t.Errorf("other tenant: %v", r.h)
	}
	for _, c := range []struct {
		path string
		h    []string
	}{
		{"/", []string{"Cookie: sid=s1", tok(3, true)}},                  // no tenant
		{"/?tenant=t1", []string{"Cookie: other=s1", tok(3, true)}},      // no sid
		{"/?tenant=t1", []string{"Cookie: sid=s1", tok(4, true)}},        // tier 4
		{"/?tenant=t1", []string{"Cookie: sid=s1", tok("3", false)}},     // beta false
		{"/?tenant=t1", []string{"Cookie: sid=s1", tok([]any{3}, true)}}, // a list has no text
		{"/?tenant=t1", []string{"Cookie: sid=s1"}},                      // no token
	} {
		if r := e.do(c.path, c.h...); r.h.Get("RateLimit") != "" {
			t.Errorf("%s %v: limited %v", c.path, c.h, r.h)
		}
	}
	if r := e.do("/?tenant=t1", "Cookie: sid=s1", tok("3", true)); r.remaining(t) != 2 {
		t.Errorf("the claim \"3\" matches 3 as text: %v", r.h)
	}
}

// Mixed fail policies: deny wins (503); otherwise local rules fall back
// and allow rules let the request through.
func TestMixedFailPolicies(t *testing.T) {
	ms := memstore.New()
	defer ms.Close()
	ds := &downStore{Store: ms}
	e := newEnv(t, ds, parse(t, `{"circuit_breaker": {"failures": 100}, "rules": [
		{"name": "a", "limit_keys": ["global"], "on_error": "allow", "algorithm_config": {"rps": 1, "burst": 100}},
		{"name": "l", "limit_keys": ["global"], "on_error": "local", "local_share": 0.5, "algorithm_config": {"rps": 1, "burst": 4}},
		{"name": "d", "limit_keys": ["header:x-strict"], "on_error": "deny", "algorithm_config": {"rps": 1}}]}`))
	for i := range 3 {
		r := e.do("/")
		want := 200
		if i == 2 {
			want = 429 // l's local share is 2
		}
		if r.code != want || r.h.Get("RateLimit-Policy") != `"l";q=2;w=4` {
			t.Fatalf("request %d: %d %v", i, r.code, r.h)
		}
	}
	if r := e.do("/", "X-Strict: 1"); r.code != 503 || r.problem(t).Rule != "d" {
		t.Fatalf("deny: %d %s", r.code, r.body)
	}
	if e.obs.count("a/enforce/error_allowed") != 3 || e.obs.count("l/enforce/local_denied") != 1 || e.obs.count("d/enforce/error_denied") != 1 {
		t.Errorf("observed %v", e.obs.decisions)
	}
}

// TestNotColocatedShadowAndBreaker: on a store that refuses multi-key
// calls, shadow rules are still decided and counted (one key at a time),
// and the breaker never sees the refusal as a failure: with on_error deny,
// a request must never get a 503.
func TestNotColocatedShadowAndBreaker(t *testing.T) {
	ms := memstore.New()
	defer ms.Close()
	e := newEnv(t, oneKeyStore{ms}, parse(t, `{"on_error": "deny", "rules": [
		{"name": "ip", "limit_keys": ["ip:address"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 100}},
		{"name": "key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 100}},
		{"name": "s1", "mode": "shadow", "limit_keys": ["ip:address"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 3}},
		{"name": "s2", "mode": "shadow", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 100}}]}`))
	for i := range 5 {
		if r := e.do("/", "X-Api-Key: a"); r.code != 200 {
			t.Fatalf("request %d: %d %s", i, r.code, r.body)
		}
	}
	if e.obs.count("s1/shadow/allowed") != 3 || e.obs.count("s1/shadow/denied") != 2 || e.obs.count("s2/shadow/allowed")+e.obs.count("s2/shadow/not_taken") != 5 {
		t.Errorf("shadow decisions: %v", e.obs.decisions)
	}
	if e.obs.errs() != 0 || len(e.obs.states) > 1 {
		t.Errorf("%d store errors, breaker states %v", e.obs.errs(), e.obs.states)
	}
}
