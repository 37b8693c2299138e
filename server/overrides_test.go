package server

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/redisstore"
)

const adminToken = "t0ken"

// eventually waits until ok holds, polling, for at most teststores.Timeout:
// the deadline is not what these tests check (the delay is documented as
// a second; a loaded machine may take longer).
func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(teststores.Timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", teststores.Timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func admin(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	return call(t, method, url, body, "Authorization", "Bearer "+adminToken, "Content-Type", "application/json")
}

// peekRule peeks at rule api's bucket of value v through the decision
// API, at cost 0: the bucket as it is.
func peekRule(t *testing.T, srv *running, v string) drip.Decision {
	t.Helper()
	code, out := post(t, srv.base+"/v1/peek", `{"rule": "api", "values": [`+jsonString(v)+`], "cost": 0}`)
	if code != 200 {
		t.Fatalf("peek: %d %s", code, out)
	}
	return decision(t, out)
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// overrideBackend opens handles on one shared store: each call of the
// function open returns makes a new client of the same server, under the
// same prefix, as a second drip serve would open.
type overrideBackend struct {
	name string
	open func(t *testing.T) (a, b func() store.Store)
	// notify: b learns of changes by notification only (its poll interval
	// is an hour); else by polling only (every 50 ms), but for defaults.
	notify   bool
	defaults bool
}

func pgHandle(t *testing.T, url, prefix string) store.Store {
	return store.Prefixed{Store: openPostgres(t, url), Prefix: prefix}
}

func redisHandle(t *testing.T, url, prefix string) store.Store {
	s, err := redisstore.Open(url, redisstore.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// redisPair opens clients of the server at url(t), under one prefix.
func redisPair(url func(testing.TB) string) func(t *testing.T) (func() store.Store, func() store.Store) {
	return func(t *testing.T) (func() store.Store, func() store.Store) {
		u, p := url(t), testserver.Prefix()
		h := func() store.Store { return redisHandle(t, u, p) }
		return h, h
	}
}

var overrideBackends = []overrideBackend{
	{"postgres-listen", func(t *testing.T) (func() store.Store, func() store.Store) {
		url, p := testserver.SharedPostgres(t).URL(), testserver.Prefix()
		h := func() store.Store { return pgHandle(t, url, p) }
		return h, h
	}, true, false},
	{"postgres-pgbouncer-polling", func(t *testing.T) (func() store.Store, func() store.Store) {
		pg := testserver.SharedPostgres(t)
		bouncer := testserver.StartPgBouncer(t, pg, 0)
		p := testserver.Prefix()
		return func() store.Store { return pgHandle(t, pg.URL(), p) }, func() store.Store { return pgHandle(t, bouncer.URL(), p) }
	}, false, false},
	{"postgres-pgbouncer", func(t *testing.T) (func() store.Store, func() store.Store) {
		// Both through the pooler, as configured by default (LISTEN tried,
		// the version polled every 500 ms): whichever brings a change, it
		// arrives, and nothing breaks.
		bouncer := testserver.StartPgBouncer(t, testserver.SharedPostgres(t), 0)
		p := testserver.Prefix()
		h := func() store.Store { return pgHandle(t, bouncer.URL(), p) }
		return h, h
	}, false, true},
	{"redis-pubsub", redisPair(testserver.SharedRedisURL), true, false},
	{"redis-polling", redisPair(testserver.SharedRedisURL), false, false},
	{"redis-sentinel-pubsub", redisPair(func(t testing.TB) string { return testserver.StartRedisSentinel(t).URL() }), true, false},
	{"redis-cluster-pubsub", redisPair(testserver.SharedRedisClusterURL), true, false},
}

// TestOverridesTwoInstances runs two drip serve instances, each with its
// own engine and its own client of one store: an override set on A
// applies on B, a bucket keeps its tokens when its limit changes (clamped
// to a lower burst), a deletion applies on B, and an instance started
// afresh applies the overrides from its first request.
func TestOverridesTwoInstances(t *testing.T) {
	for _, be := range overrideBackends {
		t.Run(be.name, func(t *testing.T) {
			// Two backends at a time: each its own prefix (or servers),
			// and mostly waiting for B to poll or be told.
			t.Parallel()
			openA, openB := be.open(t)
			follow := []override.Option{override.WithoutWatch(), override.WithPoll(50 * time.Millisecond)}
			switch {
			case be.notify:
				follow = []override.Option{override.WithPoll(time.Hour)}
			case be.defaults:
				follow = nil
			}
			path := rulesFile(t, "", 3, "api")
			cfg := Config{Rules: path, WatchEvery: -1, AdminToken: adminToken}
			a := start(t, cfg, openA())
			startB := func() *running {
				return startWith(t, cfg, openB(), func(s *Server) { s.ovrOpts = follow })
			}
			b := startB()

			if code, out := post(t, b.base+"/v1/take", `{"rule": "api", "values": ["acme"]}`); code != 200 || decision(t, out).Remaining != 2 {
				t.Fatalf("take under the rule's limit: %d %s", code, out)
			}
			put := func(burst string) {
				t.Helper()
				if code, out := admin(t, "PUT", a.admin+"/v1/admin/overrides/api/acme", `{"rate": 1, "burst": `+burst+`}`); code != 200 {
					t.Fatalf("PUT override: %d %s", code, out)
				}
			}
			put("10")
			if d := peekRule(t, a, "acme"); d.Burst != 10 {
				t.Fatalf("A does not apply its own override at once: %+v", d)
			}
			eventually(t, "B applies the override", func() bool { return peekRule(t, b, "acme").Burst == 10 })
			if d := peekRule(t, b, "acme"); d.Remaining != 2 {
				t.Fatalf("a raised limit changed the bucket's tokens: %+v, want 2 remaining", d)
			}
			if d := peekRule(t, b, "bob"); d.Burst != 3 {
				t.Fatalf("another key's limit changed: %+v", d)
			}

			put("1")
			eventually(t, "B applies the lowered burst", func() bool { return peekRule(t, b, "acme").Burst == 1 })
			if d := peekRule(t, b, "acme"); d.Remaining != 1 || d.Tokens > 1 {
				t.Fatalf("tokens not clamped to the new burst: %+v", d)
			}
			if code, out := post(t, b.base+"/v1/take", `{"rule": "api", "values": ["acme"]}`); code != 200 || !decision(t, out).Allowed {
				t.Fatalf("take of the clamped bucket's last token: %d %s", code, out)
			}
			if code, out := post(t, b.base+"/v1/take", `{"rule": "api", "values": ["acme"]}`); code != 200 || decision(t, out).Allowed {
				t.Fatalf("take past the lowered burst allowed: %d %s", code, out)
			}

			code, out := admin(t, "GET", b.admin+"/v1/admin/overrides?rule=api", "")
			var list struct{ Overrides []override.Entry }
			if err := json.Unmarshal([]byte(out), &list); code != 200 || err != nil || len(list.Overrides) != 1 {
				t.Fatalf("list: %d %s", code, out)
			}
			if e := list.Overrides[0]; e.Rule != "api" || len(e.Values) != 1 || e.Values[0] != "acme" || e.Limit.Burst != 1 || e.Limit.Period != time.Hour {
				t.Fatalf("listed %+v", e)
			}
			if code, out := admin(t, "GET", b.admin+"/v1/admin/overrides?rule=other", ""); code != 200 || !strings.Contains(out, `"overrides":[]`) {
				t.Fatalf("list of another rule: %d %s", code, out)
			}

			if code, out := admin(t, "DELETE", a.admin+"/v1/admin/overrides/api/acme", ""); code != 200 {
				t.Fatalf("DELETE: %d %s", code, out)
			}
			if code, out := admin(t, "DELETE", a.admin+"/v1/admin/overrides/api/acme", ""); code != 404 {
				t.Fatalf("DELETE of nothing: %d %s", code, out)
			}
			eventually(t, "B drops the deleted override", func() bool { return peekRule(t, b, "acme").Burst == 3 })
			if d := peekRule(t, b, "acme"); d.Remaining != 0 {
				t.Fatalf("deleting the override changed the bucket's tokens: %+v, want 0 remaining", d)
			}

			// A restarted instance: the override is in force from its first
			// request, learnt from the store when it starts (neither polls
			// nor notifications would bring it in time).
			put("7")
			eventually(t, "B applies the override", func() bool { return peekRule(t, b, "acme").Burst == 7 })
			if err := b.stop(); err != nil {
				t.Fatal(err)
			}
			follow = []override.Option{override.WithoutWatch(), override.WithPoll(time.Hour)}
			b2 := startB()
			if d := peekRule(t, b2, "acme"); d.Burst != 7 {
				t.Fatalf("a restarted instance does not apply the stored override: %+v", d)
			}
		})
	}
}

// TestOverridesAdminAPI holds the admin endpoints to their contract on
// one instance (the memory store): authentication, addressing, the
// limit's fields, and every bad input a clear 4xx that changes nothing.
func TestOverridesAdminAPI(t *testing.T) {
	path := t.TempDir() + "/rules.json"
	writeFile(t, path, `{"rules": [
	  {"name": "api", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 3}},
	  {"name": "pair", "limit_keys": ["header:x-org", "header:x-user"], "algorithm_config": {"rps": 5, "burst": 10, "fixed_cost": 2}},
	  {"name": "all", "limit_keys": ["global"], "algorithm": "fixed_window", "algorithm_config": {"rate": 100, "period": "1m"}}]}`)
	srv := start(t, Config{Rules: path, WatchEvery: -1, AdminToken: adminToken}, memstore.New())
	ov := srv.admin + "/v1/admin/overrides"

	if code, _ := call(t, "PUT", ov+"/api/acme", `{"rate": 5}`); code != 401 {
		t.Fatalf("PUT without the token: %d", code)
	}
	if code, _ := call(t, "GET", ov, "", "Authorization", "Bearer nope"); code != 401 {
		t.Fatalf("GET with a wrong token: %d", code)
	}
	for _, c := range []struct {
		method, url, body string
		code              int
		want              string
	}{
		{"PUT", ov + "/nope/acme", `{"rate": 5}`, 404, `unknown rule`},
		{"PUT", ov + "/api/acme", `{"burst": 5}`, 400, `needs \"rate\"`},
		{"PUT", ov + "/api/acme", `{"rate": 0}`, 400, `rate`},
		{"PUT", ov + "/api/acme", `{"rate": 5, "colour": 1}`, 400, `unknown field`},
		{"PUT", ov + "/api/acme", `{"rate": 5} {}`, 400, `bad limit`},
		{"PUT", ov + "/api/acme", `{"rate": 5, "Burst": 1}`, 400, `unknown field \"Burst\"`},
		{"PUT", ov + "/api/acme", `{"rate": 5, "burst": 9, "burst": 1}`, 400, `\"burst\" given twice`},
		{"PUT", ov + "/api/acme", `[{"rate": 5}]`, 400, `bad limit`},
		{"PUT", ov + "/api/acme", `{"rate": 5, "algorithm": "fixed_window"}`, 400, `algorithm`},
		{"PUT", ov + "/api/acme?value=x", `{"rate": 5}`, 400, `not both`},
		{"PUT", ov + "/api", `{"rate": 5}`, 400, `needs values`},
		{"PUT", ov + "/pair/acme", `{"rate": 5}`, 400, `needs 2 values`},
		{"PUT", ov + "/pair?value=o&value=u", `{"rate": 5, "burst": 1}`, 400, `below the rule's cost`},
		{"PUT", ov + "/api/acme", `{"rate": 5, "period": "` + strings.Repeat("9", 5000) + `"}`, 413, `body over`},
		{"PUT", ov + "/api/acme", `{"rate": 5, "period": "1000000h"}`, 400, `\"period\" must be at most 8760h (a year)`},
		{"PUT", ov + "/all", `{"rate": 5, "start": "8761h"}`, 400, `\"start\" must be at most 8760h (a year)`},
		{"PUT", ov + "/api?value=" + strings.Repeat("v", store.MaxKeyLen+1), `{"rate": 5}`, 400, `bytes together`},
		{"DELETE", ov + "/api/acme", ``, 404, `no override`},
		{"PUT", ov + "/api/%ff", `{"rate": 5}`, 400, `UTF-8`},
	} {
		code, out := admin(t, c.method, c.url, c.body)
		if code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("%s %s %s: %d %s, want %d with %q", c.method, c.url, c.body, code, out, c.code, c.want)
		}
	}
	if _, out := admin(t, "GET", ov, ""); !strings.Contains(out, `"overrides":[]`) {
		t.Fatalf("bad requests set overrides: %s", out)
	}

	// Left-out fields are the rule's but the burst (the rate); a value with a slash goes escaped in
	// the path; a multi-key rule takes ?value= per key; a global rule none.
	if code, out := admin(t, "PUT", ov+"/api/a%2Fb", `{"rate": 2}`); code != 200 || !strings.Contains(out, `"limit":{"algorithm":"token_bucket","rate":2,"period":"1h0m0s","burst":2}`) {
		t.Fatalf("PUT keeping the rule's period and burst: %d %s", code, out)
	}
	if d := peekRule(t, srv, "a/b"); d.Burst != 2 || d.Remaining != 2 {
		t.Fatalf("peek a/b: %+v", d)
	}
	if code, out := admin(t, "PUT", ov+"/pair?value=o&value=u", `{"rate": 50, "burst": 100}`); code != 200 {
		t.Fatalf("PUT pair: %d %s", code, out)
	}
	code, out := post(t, srv.base+"/v1/peek", `{"rule": "pair", "values": {"header:x-org": "o", "header:x-user": "u"}}`)
	if code != 200 || decision(t, out).Burst != 100 {
		t.Fatalf("pair's override: %d %s", code, out)
	}
	if code, out := admin(t, "PUT", ov+"/all", `{"rate": 1000, "period": "1m"}`); code != 200 || !strings.Contains(out, `"algorithm":"fixed_window"`) {
		t.Fatalf("PUT all: %d %s", code, out)
	}
	code, out = post(t, srv.base+"/v1/peek", `{"rule": "all"}`)
	if code != 200 || decision(t, out).Burst != 1000 {
		t.Fatalf("all's override: %d %s", code, out)
	}
	if _, out := admin(t, "GET", ov, ""); strings.Count(out, `"rule"`) != 3 {
		t.Fatalf("list: %s", out)
	}
	if _, m := call(t, "GET", srv.admin+"/metrics", ""); !strings.Contains(m, "\ndrip_overrides 3\n") || !strings.Contains(m, "\ndrip_overrides_version 3\n") {
		t.Fatalf("metrics:\n%s", grep(m, "drip_overrides"))
	}
}

// TestOverridesFull: a store holding override.MaxOverrides refuses a new
// one with 409, and still takes changes to those it holds.
func TestOverridesFull(t *testing.T) {
	st := memstore.New()
	ctx := context.Background()
	for i := range override.MaxOverrides {
		if err := st.PutOverride(ctx, "filler"+itoa(i), []byte(`{}`), override.MaxOverrides); err != nil {
			t.Fatal(err)
		}
	}
	srv := start(t, Config{Rules: rulesFile(t, "", 3, "api"), WatchEvery: -1, AdminToken: adminToken}, st)
	if code, out := admin(t, "PUT", srv.admin+"/v1/admin/overrides/api/acme", `{"rate": 5}`); code != http.StatusConflict {
		t.Fatalf("PUT over the bound: %d %s", code, out)
	}
	if _, err := st.DeleteOverride(ctx, "filler0"); err != nil {
		t.Fatal(err)
	}
	if code, out := admin(t, "PUT", srv.admin+"/v1/admin/overrides/api/acme", `{"rate": 5}`); code != 200 {
		t.Fatalf("PUT under the bound: %d %s", code, out)
	}
	if code, out := admin(t, "PUT", srv.admin+"/v1/admin/overrides/api/acme", `{"rate": 6}`); code != 200 {
		t.Fatalf("PUT of a held key at the bound: %d %s", code, out)
	}
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// TestAdminRulesShowsClaims: /v1/admin/rules shows a rule's
// limit_from_claims as the rules file writes it, defaults filled in.
func TestAdminRulesShowsClaims(t *testing.T) {
	path := t.TempDir() + "/rules.json"
	writeFile(t, path, `{"jwt": {"verify": false}, "rules": [
	  {"name": "api", "limit_keys": ["jwt:sub"], "algorithm_config": {"rps": 5},
	   "limit_from_claims": {"rate_claim": "rl", "max_rate": 100}}]}`)
	srv := start(t, Config{Rules: path, WatchEvery: -1, AdminToken: adminToken}, memstore.New())
	code, out := admin(t, "GET", srv.admin+"/v1/admin/rules", "")
	if want := `"limit_from_claims":{"rate_claim":"rl","min_rate":1,"max_rate":100,"min_burst":1}`; code != 200 || !strings.Contains(out, want) {
		t.Fatalf("%d %s, want %s", code, out, want)
	}
}

// TestOverridesGateway: the gateway decides with the override of the
// request's bucket (RateLimit-Policy shows it), other keys with the rule.
func TestOverridesGateway(t *testing.T) {
	up := newUpstream(t)
	srv := start(t, Config{Rules: rulesFile(t, "", 3, "api"), Upstream: up.URL, WatchEvery: -1, AdminToken: adminToken}, memstore.New())
	if code, out := admin(t, "PUT", srv.admin+"/v1/admin/overrides/api/acme", `{"rate": 1, "period": "1m", "burst": 5}`); code != 200 {
		t.Fatalf("PUT: %d %s", code, out)
	}
	for _, c := range []struct{ key, policy, remaining string }{
		{"acme", `"api";q=5;w=300`, "4"},
		{"bob", `"api";q=3;w=10800`, "2"},
	} {
		resp, body := gwGet(t, srv.base, "/", c.key)
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Policy") != c.policy || resp.Header.Get("RateLimit-Remaining") != c.remaining {
			t.Errorf("%s: %d %q %v", c.key, resp.StatusCode, body, resp.Header)
		}
	}
}

// TestOverridesConcurrency: a concurrency rule's override sets its
// max_in_flight (and lease_ttl), the fields of its own limit; the fields of
// a token bucket are refused for it, and its fields for a token bucket.
func TestOverridesConcurrency(t *testing.T) {
	path := t.TempDir() + "/rules.json"
	writeFile(t, path, `{"rules": [
	  {"name": "jobs", "limit_keys": ["header:x-tenant"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1, "lease_ttl": "1m"}},
	  {"name": "api", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rps": 5, "burst": 10}}]}`)
	srv := start(t, Config{Rules: path, WatchEvery: -1, AdminToken: adminToken}, memstore.New())
	ov := srv.admin + "/v1/admin/overrides"
	for _, c := range []struct {
		url, body, want string
	}{
		{ov + "/jobs/acme", `{"rate": 5}`, `needs \"max_in_flight\"`},
		{ov + "/jobs/acme", `{"max_in_flight": 2, "rate": 5}`, `\"rate\" does not apply to a concurrency rule`},
		{ov + "/jobs/acme", `{"max_in_flight": 0}`, `max_in_flight`},
		{ov + "/jobs/acme", `{"max_in_flight": 2, "algorithm": "token_bucket"}`, `algorithm`},
		{ov + "/api/k", `{"rate": 5, "max_in_flight": 2}`, `\"max_in_flight\" applies to concurrency rules only`},
	} {
		if code, out := admin(t, "PUT", c.url, c.body); code != 400 || !strings.Contains(out, c.want) {
			t.Errorf("PUT %s %s: %d %s, want 400 with %q", c.url, c.body, code, out, c.want)
		}
	}
	acquire := func() bool {
		t.Helper()
		code, out := post(t, srv.base+"/v1/acquire", `{"rule": "jobs", "values": ["acme"]}`)
		if code != 200 {
			t.Fatalf("acquire: %d %s", code, out)
		}
		return decision(t, out).Allowed
	}
	if got := []bool{acquire(), acquire()}; !slices.Equal(got, []bool{true, false}) {
		t.Fatalf("the rule's own max_in_flight 1: acquires %v, want one slot", got)
	}
	code, out := admin(t, "PUT", ov+"/jobs/acme", `{"max_in_flight": 3}`)
	if code != 200 || !strings.Contains(out, `"algorithm":"concurrency"`) || !strings.Contains(out, `"max_in_flight":3`) || !strings.Contains(out, `"lease_ttl":"1m0s"`) {
		t.Fatalf("PUT max_in_flight 3, keeping the rule's lease_ttl: %d %s", code, out)
	}
	// One slot is held already; the override leaves two more.
	if got := []bool{acquire(), acquire(), acquire()}; !slices.Equal(got, []bool{true, true, false}) {
		t.Fatalf("override max_in_flight 3: acquires %v, want 3 slots in all", got)
	}
	if code, out := admin(t, "PUT", ov+"/jobs/beta", `{"max_in_flight": 2, "lease_ttl": "5s"}`); code != 200 || !strings.Contains(out, `"lease_ttl":"5s"`) {
		t.Fatalf("PUT with lease_ttl: %d %s", code, out)
	}
}
