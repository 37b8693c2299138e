package httplimit_test

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// keyed is a KeyLimiter on a fake clock with an observer, in front of a
// handler that counts its requests.
type keyed struct {
	lim   *httplimit.KeyLimiter
	h     http.Handler
	clock *testclock.Clock
	obs   *observer
	hits  int
}

func newKeyed(t *testing.T, store store.Store, kl httplimit.KeyLimit, clock *testclock.Clock) *keyed {
	t.Helper()
	if store == nil {
		ms := memstore.New()
		t.Cleanup(func() { ms.Close() })
		store = ms
	}
	if clock == nil {
		clock = testclock.New()
	}
	k := &keyed{clock: clock, obs: &observer{}}
	lim, err := httplimit.NewKeyLimiter(store, kl, engine.WithTimeout(teststores.Timeout), engine.WithClock(clock.Now),
		engine.WithObserver(k.obs), engine.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	k.lim = lim
	k.h = lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k.hits++
		w.Write([]byte("hello\n"))
	}))
	return k
}

// record serves req with h.
func record(h http.Handler, req *http.Request) resp {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return resp{rec.Code, rec.Result().Header, rec.Body.String()}
}

// userReq is a GET from user (none when empty) with the given X-Cost
// (none when empty), from a peer without an IP address, so that the
// rules middleware's Retry-After jitter is seeded by the bucket key as
// the key limiter's is.
func userReq(user, cost string) *http.Request {
	req := httptest.NewRequest("GET", "/", nil)
	req.RemoteAddr = "@"
	if user != "" {
		req.Header.Set("X-User", user)
	}
	if cost != "" {
		req.Header.Set("X-Cost", cost)
	}
	return req
}

func headerKey(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }

// headerCost reads X-Cost as the rules' cost_source header:x-cost does,
// with a default cost of 1.
func headerCost(r *http.Request) float64 {
	if c, ok := engine.ParseCost(r.Header.Get("X-Cost")); ok {
		return c
	}
	return 1
}

// TestKeyLimiterAsRules: a KeyLimit answers exactly what the rules
// middleware answers for the equivalent rule (status, every header,
// Retry-After with its jitter, body, observer events), request by
// request on one fake clock.
func TestKeyLimiterAsRules(t *testing.T) {
	type step struct {
		user, cost string
		wait       time.Duration // before the request
	}
	var tokens []step
	for i := range 8 {
		tokens = append(tokens, step{"alice", "", 0}, step{"bob", "", 0}, step{"", "", 0})
		if i%3 == 2 {
			tokens = append(tokens, step{"alice", "", 700 * time.Millisecond})
		}
	}
	tokens = append(tokens, step{"alice", "", 5 * time.Second}, step{"alice|x", "", 0}, step{strings.Repeat("z", 3000), "", 0})
	for _, c := range []struct {
		name  string
		rule  string
		limit drip.Limit
		cost  bool
		steps []step
		want  []string // statuses and reasons that must occur
	}{
		{"token bucket", `{"name": "per-user", "limit_keys": ["header:x-user"], "algorithm_config": {"rps": 1, "burst": 3}}`,
			drip.PerSecond(1).WithBurst(3), false, tokens, []string{"200", "429 token_bucket_exceeded"}},
		{"fixed window", `{"name": "per-user", "limit_keys": ["header:x-user"], "algorithm": "fixed_window",
			"algorithm_config": {"rate": 5, "period": "1m"}}`,
			drip.Per(5, time.Minute).Window(), false,
			append(tokens, step{"alice", "", time.Minute}, step{"alice", "", 0}), []string{"200", "429 fixed_window_exceeded"}},
		{"costs", `{"name": "per-user", "limit_keys": ["header:x-user"],
			"algorithm_config": {"rate": 10, "period": "10s", "burst": 4, "cost_source": "header:x-cost"}}`,
			drip.Per(10, 10*time.Second).WithBurst(4), true,
			[]step{{"alice", "2", 0}, {"alice", "abc", 0}, {"alice", "0.5", 0}, {"alice", "9", 0}, {"alice", "1", 0},
				{"alice", "", 0}, {"bob", "4", 0}, {"bob", "-1", 0}, {"alice", "3", 1500 * time.Millisecond}, {"alice", "1e3", 0}},
			[]string{"200", "429 cost_exceeds_burst", "429 token_bucket_exceeded"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := testclock.New()
			e := newEnv(t, nil, parse(t, `{"rules": [`+c.rule+`]}`), engine.WithClock(clock.Now))
			kl := httplimit.KeyLimit{Name: "per-user", Limit: c.limit, Key: headerKey}
			if c.cost {
				kl.Cost = headerCost
			}
			k := newKeyed(t, nil, kl, clock)
			seen := map[string]bool{}
			for i, s := range c.steps {
				clock.Add(s.wait)
				want := record(e.lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello\n")) })), userReq(s.user, s.cost))
				got := record(k.h, userReq(s.user, s.cost))
				if got.code != want.code || !reflect.DeepEqual(got.h, want.h) || got.body != want.body {
					t.Fatalf("step %d %+v:\nkey limiter %d %v %q\nrules       %d %v %q", i, s, got.code, got.h, got.body, want.code, want.h, want.body)
				}
				seen[statusReason(t, got)] = true
				if s.user == "" && got.h.Get("RateLimit-Policy") != "" {
					t.Fatalf("step %d: a request without a key got %v", i, got.h)
				}
			}
			for _, w := range c.want {
				if !seen[w] {
					t.Errorf("no %q among %v: the comparison missed a case", w, seen)
				}
			}
			if !maps.Equal(k.obs.decisions, e.obs.decisions) {
				t.Errorf("observed %v, the rules middleware %v", k.obs.decisions, e.obs.decisions)
			}
		})
	}
}

// statusReason is "200", or a denial's status and problem reason.
func statusReason(t *testing.T, r resp) string {
	t.Helper()
	if r.code == 200 {
		return "200"
	}
	return strconv.Itoa(r.code) + " " + r.problem(t).Reason
}

type userCtxKey struct{}

// TestKeyFromContext: the key is the user an authentication middleware
// in front put in the request's context; requests without a user are not
// limited.
func TestKeyFromContext(t *testing.T) {
	k := newKeyed(t, nil, httplimit.KeyLimit{
		Name:  "per-user",
		Limit: drip.PerMinute(2),
		Key: func(r *http.Request) (string, error) {
			u, _ := r.Context().Value(userCtxKey{}).(string)
			return u, nil
		},
	}, nil)
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u := r.Header.Get("X-Token"); u != "" { // stands for a verified token
				r = r.WithContext(context.WithValue(r.Context(), userCtxKey{}, "user-"+u))
			}
			next.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewServer(auth(k.h))
	defer srv.Close()
	e := &env{t: t, srv: srv}
	for i := range 2 {
		r := e.do("/", "X-Token: a")
		if r.code != 200 || r.remaining(t) != 1-i || r.h.Get("RateLimit-Policy") != `"per-user";q=2;w=60` {
			t.Fatalf("request %d: %d %v", i, r.code, r.h)
		}
	}
	r := e.do("/", "X-Token: a")
	if r.code != 429 || r.h.Get("RateLimit") == "" {
		t.Fatalf("third: %d %v", r.code, r.h)
	}
	if p := r.problem(t); p.Rule != "per-user" || p.Reason != engine.ReasonTokenBucket || p.RetryAfter < 30 || p.RetryAfter > 45 {
		t.Errorf("problem %+v", p) // a token every 30 s, jitter up to 50%
	}
	if r := e.do("/", "X-Token: b"); r.code != 200 || r.remaining(t) != 1 {
		t.Errorf("another user: %d %v", r.code, r.h)
	}
	for range 5 {
		if r := e.do("/"); r.code != 200 || r.h.Get("RateLimit-Policy") != "" || r.h.Get("RateLimit") != "" {
			t.Fatalf("no user: %d %v", r.code, r.h)
		}
	}
	if k.hits != 8 || k.obs.count("per-user/enforce/allowed") != 3 || k.obs.count("per-user/enforce/denied") != 1 {
		t.Errorf("hits %d, observed %v", k.hits, k.obs.decisions)
	}
	res := k.lim.Decide(context.Background(), httptest.NewRequest("GET", "/", nil))
	if res.Err != nil || !res.Allowed || len(res.Applied) != 0 {
		t.Errorf("Decide without a user: %+v", res)
	}
}

// TestKeyCost: the cost function's costs; a bad cost counts as 1; a cost
// above the burst never passes and takes nothing.
func TestKeyCost(t *testing.T) {
	var cost float64
	k := newKeyed(t, nil, httplimit.KeyLimit{
		Limit: drip.PerHour(1).WithBurst(10),
		Key:   func(*http.Request) (string, error) { return "k", nil },
		Cost:  func(*http.Request) float64 { return cost },
	}, nil)
	left := 10.0
	for _, c := range []struct{ cost, taken float64 }{
		{2, 2}, {0.5, 0.5}, {0, 0}, {-1, 1}, {math.NaN(), 1}, {math.Inf(1), 1}, {2e12, 1}, {1, 1},
	} {
		cost = c.cost
		left -= c.taken
		r := record(k.h, userReq("", ""))
		if r.code != 200 || r.remaining(t) != int(left) || r.h.Get("RateLimit-Policy") != `"per-key";q=10;w=36000` {
			t.Fatalf("cost %v: %d %v, want %d left", c.cost, r.code, r.h, int(left))
		}
	}
	cost = 11
	r := record(k.h, userReq("", ""))
	if r.code != 429 || r.h.Get("Retry-After") != "" || r.remaining(t) != int(left) {
		t.Fatalf("cost 11: %d %v", r.code, r.h)
	}
	if p := r.problem(t); p.Reason != engine.ReasonCostExceedsBurst || p.Rule != "per-key" {
		t.Errorf("problem %+v", p)
	}
	cost = left
	if r := record(k.h, userReq("", "")); r.code != 200 || r.remaining(t) != 0 {
		t.Errorf("the rest: %d %v", r.code, r.h)
	}
	if k.hits != 9 {
		t.Errorf("hits %d", k.hits)
	}
}

// TestKeyOnError: the fail policies of a KeyLimit, with a store that is
// down, are a rule's: allow without headers, deny with 503, local at a
// share of the limit; a breaker then stops calling the store.
func TestKeyOnError(t *testing.T) {
	for _, c := range []struct {
		policy rules.OnError
		check  func(t *testing.T, i int, r resp)
		events map[string]int
	}{
		{rules.Allow, func(t *testing.T, i int, r resp) {
			if r.code != 200 || r.h.Get("RateLimit") != "" || r.h.Get("RateLimit-Policy") != "" {
				t.Fatalf("request %d: %d %v", i, r.code, r.h)
			}
		}, map[string]int{"per-key/enforce/error_allowed": 12}},
		{rules.Deny, func(t *testing.T, i int, r resp) {
			if r.code != 503 || r.h.Get("Retry-After") != "1" {
				t.Fatalf("request %d: %d %v", i, r.code, r.h)
			}
			if p := r.problem(t); p.Reason != engine.ReasonStoreUnavailable || p.Rule != "per-key" {
				t.Fatalf("problem %+v", p)
			}
		}, map[string]int{"per-key/enforce/error_denied": 12}},
		{rules.Local, func(t *testing.T, i int, r resp) {
			// Half of the burst of 20: 10 pass, then 429.
			if i < 10 {
				if r.code != 200 || r.h.Get("RateLimit-Policy") != `"per-key";q=10;w=2` || r.remaining(t) != 9-i {
					t.Fatalf("request %d: %d %v", i, r.code, r.h)
				}
				return
			}
			if r.code != 429 || r.problem(t).Reason != engine.ReasonTokenBucket {
				t.Fatalf("request %d: %d %s", i, r.code, r.body)
			}
		}, map[string]int{"per-key/enforce/local_allowed": 10, "per-key/enforce/local_denied": 2}},
	} {
		t.Run(string(c.policy), func(t *testing.T) {
			ds := &downStore{Store: memstore.New()}
			k := newKeyed(t, ds, httplimit.KeyLimit{Limit: drip.PerSecond(10).WithBurst(20), OnError: c.policy, Key: headerKey}, nil)
			for i := range 12 {
				c.check(t, i, record(k.h, userReq("u", "")))
			}
			if !maps.Equal(k.obs.decisions, c.events) {
				t.Errorf("observed %v, want %v", k.obs.decisions, c.events)
			}
			if ds.calls.Load() != 5 || k.obs.errs() != 5 || k.lim.BreakerState() != engine.BreakerOpen {
				t.Errorf("store calls %d, errors %d, breaker %s", ds.calls.Load(), k.obs.errs(), k.lim.BreakerState())
			}
			// Back after the cool-down: the store decides again.
			ds.up.Store(true)
			k.clock.Add(rules.DefaultBreakerCooldown)
			if r := record(k.h, userReq("u", "")); r.code != 200 || r.remaining(t) != 19 {
				t.Errorf("after recovery: %d %v", r.code, r.h)
			}
		})
	}
}

// TestKeyError: a failing key function answers 500 (or the program's
// KeyError), the handler is not called, and the store is not asked.
func TestKeyError(t *testing.T) {
	errNoUser := errors.New("no session for token s3cr3t")
	keyFn := func(r *http.Request) (string, error) {
		if r.Header.Get("X-User") == "" {
			return "", errNoUser
		}
		return r.Header.Get("X-User"), nil
	}
	ds := &downStore{Store: memstore.New()}
	ds.up.Store(true)
	k := newKeyed(t, ds, httplimit.KeyLimit{Name: "users", Limit: drip.PerSecond(1), Key: keyFn}, nil)
	r := record(k.h, userReq("", ""))
	if r.code != 500 || k.hits != 0 || ds.calls.Load() != 0 {
		t.Fatalf("%d, hits %d, store calls %d", r.code, k.hits, ds.calls.Load())
	}
	if p := r.problem(t); p.Reason != httplimit.ReasonKeyError || p.Rule != "users" || strings.Contains(r.body, "s3cr3t") {
		t.Errorf("problem %s", r.body)
	}
	if len(k.obs.decisions) != 0 {
		t.Errorf("observed %v", k.obs.decisions)
	}
	// Decide's outcome of a failed key function: a refusal (a 500 in
	// the problem Handler writes), nothing decided, the function's error.
	if out := k.lim.Decide(context.Background(), userReq("", "")); !errors.Is(out.Err, errNoUser) || out.Allowed ||
		!out.Refused || out.Reason != httplimit.ReasonKeyError || httplimit.Status(out) != 500 || len(out.Applied) != 0 {
		t.Errorf("Decide: %+v", out)
	}

	var mu sync.Mutex
	var got error
	k2 := newKeyed(t, nil, httplimit.KeyLimit{Limit: drip.PerSecond(1), Key: keyFn,
		KeyError: func(w http.ResponseWriter, r *http.Request, err error) {
			mu.Lock()
			got = err
			mu.Unlock()
			http.Error(w, "who are you?", http.StatusUnauthorized)
		}}, nil)
	if r := record(k2.h, userReq("", "")); r.code != 401 || r.body != "who are you?\n" || !errors.Is(got, errNoUser) || k2.hits != 0 {
		t.Errorf("KeyError: %d %q %v", r.code, r.body, got)
	}
}

// keyStore records the keys a store is asked for.
type keyStore struct {
	store.Store
	mu   sync.Mutex
	keys []string
}

func (s *keyStore) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	s.mu.Lock()
	if len(items) == 1 {
		s.keys = append(s.keys, items[0].Key)
	}
	s.mu.Unlock()
	return s.Store.Apply(ctx, op, at, items, results)
}

// Caps are the store's, but not InProcess: it stands for a store on a
// server, whose calls get a deadline.
func (k *keyStore) Caps() store.Caps {
	c := k.Store.Caps()
	c.InProcess = false
	return c
}

// TestKeyLong: keys of any length are limited, each in its own bucket,
// under bucket keys the stores accept (at most store.MaxKeyLen bytes).
func TestKeyLong(t *testing.T) {
	ks := &keyStore{Store: memstore.New()}
	k := newKeyed(t, ks, httplimit.KeyLimit{Limit: drip.PerHour(1), Key: headerKey}, nil)
	long := strings.Repeat("x", 2*store.MaxKeyLen)
	other := long[:len(long)-1] + "y"
	for _, u := range []string{long, other} {
		if r := record(k.h, userReq(u, "")); r.code != 200 || r.remaining(t) != 0 {
			t.Fatalf("first request of a long key: %d %v", r.code, r.h)
		}
	}
	if r := record(k.h, userReq(long, "")); r.code != 429 {
		t.Fatalf("second request of a long key: %d %v", r.code, r.h)
	}
	if len(ks.keys) != 3 || ks.keys[0] == ks.keys[1] || ks.keys[0] != ks.keys[2] {
		t.Fatalf("bucket keys %q", ks.keys)
	}
	for _, key := range ks.keys {
		if store.CheckKey(key) != nil || !strings.HasPrefix(key, "per-key|") || len(key) > 200 {
			t.Errorf("bucket key %q", key)
		}
	}
	// A key cannot forge another: '|' and '\' are escaped.
	record(k.h, userReq(`a|b`, ""))
	record(k.h, userReq(`a\|b`, ""))
	if n := len(ks.keys); ks.keys[n-1] == ks.keys[n-2] {
		t.Errorf("bucket keys %q", ks.keys[n-2:])
	}
}

func TestNewKeyLimiterInvalid(t *testing.T) {
	key := func(*http.Request) (string, error) { return "k", nil }
	for _, c := range []struct {
		kl   httplimit.KeyLimit
		want string
	}{
		{httplimit.KeyLimit{Limit: drip.PerSecond(1)}, "Key is nil"},
		{httplimit.KeyLimit{Limit: drip.PerSecond(1), Key: key, Name: "a b"}, "name"},
		{httplimit.KeyLimit{Limit: drip.PerSecond(-1), Key: key}, "rate"},
		{httplimit.KeyLimit{Key: key}, "rate"},
		{httplimit.KeyLimit{Limit: drip.PerSecond(1).WithBurst(0.5), Key: key}, "burst must be >= 1"},
		{httplimit.KeyLimit{Limit: drip.PerSecond(1), Key: key, OnError: "retry"}, "on_error"},
		{httplimit.KeyLimit{Limit: drip.PerSecond(1), Key: key, LocalShare: 1.5}, "local_share"},
	} {
		l, err := httplimit.NewKeyLimiter(nil, c.kl)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error about %q", c.kl, err, c.want)
		}
		if l != nil {
			t.Errorf("%+v: a limiter with the error", c.kl)
		}
	}
	// A burst below 1 is fine when the program computes costs.
	ms := memstore.New()
	defer ms.Close()
	l, err := httplimit.NewKeyLimiter(ms, httplimit.KeyLimit{Limit: drip.PerSecond(1).WithBurst(0.5), Key: key,
		Cost: func(*http.Request) float64 { return 0.25 }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if res := l.Decide(context.Background(), userReq("", "")); res.Err != nil || !res.Allowed || res.Top.Decision.Remaining != 0 {
		t.Errorf("%+v", res)
	}
}

// TestKeyPanics: a Key or Cost function that panics is not recovered by
// the middleware: the panic unwinds as any handler's does (net/http logs
// it and drops the connection), before anything was taken, and the
// server goes on serving; the key's bucket is untouched.
func TestKeyPanics(t *testing.T) {
	ks := &keyStore{Store: memstore.New()}
	kl := httplimit.KeyLimit{Limit: drip.PerHour(3),
		Key: func(r *http.Request) (string, error) {
			if r.Header.Get("X-Boom") == "key" {
				panic("key function")
			}
			return r.Header.Get("X-User"), nil
		},
		Cost: func(r *http.Request) float64 {
			if r.Header.Get("X-Boom") == "cost" {
				panic("cost function")
			}
			return 1
		}}
	k := newKeyed(t, ks, kl, nil)
	srv := httptest.NewUnstartedServer(k.h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the recovered panics
	srv.Start()
	t.Cleanup(srv.Close)
	get := func(boom string) (*http.Response, error) {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-User", "alice")
		if boom != "" {
			req.Header.Set("X-Boom", boom)
		}
		resp, err := srv.Client().Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	for range 5 {
		for _, boom := range []string{"key", "cost"} {
			if resp, err := get(boom); err == nil {
				t.Fatalf("a %s function that panics: %d, want the connection dropped", boom, resp.StatusCode)
			}
		}
	}
	resp, err := get("")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Remaining") != "2" || k.hits != 1 {
		t.Errorf("after the panics: %d, remaining %q, %d hits: want the first take of a full bucket",
			resp.StatusCode, resp.Header.Get("RateLimit-Remaining"), k.hits)
	}
	if len(ks.keys) != 1 {
		t.Errorf("store calls %q, want only the last request's", ks.keys)
	}
}

// TestKeyInFlight: a KeyLimit may be a concurrency limit: while a
// request holds the key's one slot, the next is a 429, and once it
// returns the slot is free again (its burst is its slots, never below 1).
func TestKeyInFlight(t *testing.T) {
	ms := memstore.New()
	defer ms.Close()
	l, err := httplimit.NewKeyLimiter(ms, httplimit.KeyLimit{Limit: drip.InFlight(1, time.Minute), Key: headerKey})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	entered, release := make(chan struct{}), make(chan struct{})
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			close(entered)
			<-release
		}
	}))
	held := userReq("alice", "")
	held.Header.Set("X-Hold", "1")
	done := make(chan resp)
	go func() { done <- record(h, held) }()
	<-entered
	if r := record(h, userReq("alice", "")); r.code != http.StatusTooManyRequests {
		t.Fatalf("a second request while the slot is held: %d, want 429", r.code)
	}
	if r := record(h, userReq("bob", "")); r.code != http.StatusOK {
		t.Fatalf("another key: %d, want 200", r.code)
	}
	close(release)
	if r := <-done; r.code != http.StatusOK {
		t.Fatalf("the holding request: %d, want 200", r.code)
	}
	if r := record(h, userReq("alice", "")); r.code != http.StatusOK {
		t.Fatalf("after the slot was released: %d, want 200", r.code)
	}
}
