package server

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/store/redisstore"
)

// The key end-to-end cases again on the shared stores, with real servers
// that the test harness starts (and kills, for the store-down cases).

func TestMain(m *testing.M) { testserver.Main(m) }

// backend opens stores of one kind: on a server shared by the test binary
// (with a fresh key prefix), or on a server of the test's own that it can
// stop and start.
type backend struct {
	name   string
	shared func(t *testing.T) store.Store
	own    func(t *testing.T) (store store.Store, stop, start func())
}

func openPostgres(t testing.TB, url string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), url+"&drip_install=true&drip_sweep=0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var backends = []backend{
	{
		name:   "postgres",
		shared: func(t *testing.T) store.Store { return teststores.Open(t, "postgres") },
		own: func(t *testing.T) (store.Store, func(), func()) {
			pg := testserver.StartPostgres(t)
			return openPostgres(t, pg.URL()), func() {
					if err := pg.Kill(); err != nil {
						t.Fatal(err)
					}
				}, func() {
					if err := pg.Start(); err != nil {
						t.Fatal(err)
					}
				}
		},
	},
	{
		name:   "redis",
		shared: func(t *testing.T) store.Store { return teststores.Open(t, "redis") },
		own: func(t *testing.T) (store.Store, func(), func()) {
			r := testserver.StartRedis(t)
			s, err := redisstore.Open(r.URL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s, r.Kill, func() {
				if err := r.Start(); err != nil {
					t.Fatal(err)
				}
			}
		},
	},
}

func TestStoresDecisionAPI(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			path := rulesFile(t, "", 3, "api")
			srv := start(t, Config{Rules: path, WatchEvery: -1, StoreTimeout: teststores.Timeout}, b.shared(t))
			for i, want := range []string{`"allowed":true,"tokens":2`, `"allowed":true,"tokens":1`, `"allowed":true,"tokens":0`, `"allowed":false,"tokens":0`} {
				code, out := post(t, srv.base+"/v1/take", `{"rule": "api", "values": ["k"]}`)
				if code != 200 || !strings.Contains(out, want) {
					t.Fatalf("take %d by rule on %s: %d %s, want %s", i, b.name, code, out, want)
				}
			}
			code, out := post(t, srv.base+"/v1/take", `{"requests": [{"key": "a", `+lim+`, "cost": 3}, {"key": "b", `+lim+`}]}`)
			if code != 200 || !strings.HasPrefix(out, `{"allowed":true`) {
				t.Fatalf("multi-take on %s: %d %s", b.name, code, out)
			}
			code, out = post(t, srv.base+"/v1/peek", `{"key": "a", `+lim+`}`)
			if code != 200 || !strings.HasPrefix(out, `{"allowed":false,"tokens":0`) {
				t.Fatalf("peek on %s: %d %s", b.name, code, out)
			}
			if code, out := post(t, srv.base+"/v1/reset", `{"rule": "api", "values": ["k"]}`); code != 200 {
				t.Fatalf("reset on %s: %d %s", b.name, code, out)
			}
			if code, out := post(t, srv.base+"/v1/take", `{"rule": "api", "values": ["k"], "cost": 3}`); code != 200 || !strings.Contains(out, `"allowed":true`) {
				t.Fatalf("take after reset on %s: %d %s", b.name, code, out)
			}
			if code, out := post(t, srv.base+"/v1/take", `{"key": "k", "limit": {"rate": 0}}`); code != 400 {
				t.Fatalf("bad limit on %s: %d %s", b.name, code, out)
			}
		})
	}
}

func TestStoresGatewayReloadUnderLoad(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { testGatewayReloadUnderLoad(t, b.shared(t)) })
	}
}

// TestStoresDown kills the store's server under three gateways (on_error
// allow, deny and local), then starts it again: the gateways recover once
// the breaker's cool-down has passed. While it is down, the gateways that
// still decide (allow, local) stay ready.
func TestStoresDown(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			store, stop, restart := b.own(t)
			up := newUpstream(t)
			gw := map[string]*running{}
			for _, policy := range []string{"allow", "deny", "local"} {
				path := filepath.Join(t.TempDir(), policy+".json")
				writeFile(t, path, `{"on_error": "`+policy+`", "local_share": 0.5,
				  "circuit_breaker": {"failures": 1, "cooldown": "200ms"},
				  "rules": [{"name": "`+policy+`", "limit_keys": ["header:x-api-key"],
				    "algorithm_config": {"rate": 1, "period": "1h", "burst": 4}}]}`)
				gw[policy] = start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1, StoreTimeout: 2 * time.Second}, store)
			}
			for policy, srv := range gw {
				if resp, body := gwGet(t, srv.base, "/", "k"); resp.StatusCode != 200 || resp.Header.Get("RateLimit-Remaining") != "3" {
					t.Fatalf("%s with the store up: %d %q %v", policy, resp.StatusCode, body, resp.Header)
				}
			}
			stop()
			want := map[string][]int{"allow": {200, 200, 200}, "deny": {503, 503, 503}, "local": {200, 200, 429}}
			for policy, srv := range gw {
				for i, code := range want[policy] {
					begin := time.Now()
					resp, body := gwGet(t, srv.base, "/", "k")
					if resp.StatusCode != code {
						t.Errorf("%s, request %d with the store down: %d %q, want %d", policy, i, resp.StatusCode, body, code)
					}
					if d := time.Since(begin); d > 5*time.Second {
						t.Errorf("%s, request %d with the store down took %v", policy, i, d)
					}
				}
				// Ready where the policy still decides without the store.
				if code, _ := call(t, "GET", srv.admin+"/readyz", ""); code != map[string]int{"allow": 200, "deny": 503, "local": 200}[policy] {
					t.Errorf("%s: /readyz with the store down: %d", policy, code)
				}
				_, metrics := call(t, "GET", srv.admin+"/metrics", "")
				if !strings.Contains(metrics, `drip_store_circuit_state{state="open"} 1`) && !strings.Contains(metrics, `drip_store_circuit_state{state="half_open"} 1`) {
					t.Errorf("%s: the breaker is not open with the store down:\n%s", policy, grep(metrics, "circuit"))
				}
			}
			restart()
			for policy, srv := range gw {
				deadline := time.Now().Add(15 * time.Second)
				for {
					resp, _ := gwGet(t, srv.base, "/", "k2")
					if resp.StatusCode == 200 && resp.Header.Get("RateLimit-Remaining") != "" && !strings.Contains(resp.Header.Get("RateLimit-Policy"), "q=2") {
						break // decided by the store again (not the local fallback's half)
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s did not recover after the store came back: %d %v", policy, resp.StatusCode, resp.Header)
					}
					time.Sleep(50 * time.Millisecond)
				}
				if code, out := call(t, "GET", srv.admin+"/readyz", ""); code != 200 {
					t.Errorf("%s: /readyz after the store came back: %d %s", policy, code, out)
				}
			}
		})
	}
}
