package server

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/override"
)

const (
	staleBucketRule = `{"rules": [{"name": "x", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"rate": 1, "period": "1h", "burst": 3}}]}`
	staleConcRule = `{"rules": [{"name": "x", "limit_keys": ["header:x-api-key"], "algorithm": "concurrency",
	  "algorithm_config": {"max_in_flight": 1, "lease_ttl": "1h"}}]}`
)

// staleServers serve the rules in body on one store: srv the decision
// API (logging to the buffer it returns), gw a gateway whose upstream
// holds requests to /slow until finish is closed (started says when one
// arrived).
func staleServers(t *testing.T, st teststores.Store, body string) (srv, gw *running, path string, log *testserver.LockedBuffer, started, finish chan struct{}) {
	t.Helper()
	up, started, finish := slowUpstream(t)
	path = filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, body)
	log = &testserver.LockedBuffer{}
	store := st.Open(t)
	srv = start(t, Config{Rules: path, WatchEvery: -1, AdminToken: adminToken,
		Logger: slog.New(slog.NewTextHandler(log, nil))}, store)
	gw = start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1}, store)
	return srv, gw, path, log, started, finish
}

// reloadBoth reloads the rules of both servers and has gw follow the
// overrides srv set.
func reloadBoth(t *testing.T, srv, gw *running) {
	t.Helper()
	for _, s := range []*running{srv, gw} {
		if err := s.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	if err := gw.ovr.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// staleListed checks what GET /v1/admin/overrides and the metrics say of
// the one override of rule x: stale (with a reason naming want) or not.
func staleListed(t *testing.T, srv *running, stale bool, want string) {
	t.Helper()
	code, out := admin(t, "GET", srv.admin+"/v1/admin/overrides", "")
	var list struct {
		Overrides []struct {
			Rule        string `json:"rule"`
			Stale       bool   `json:"stale"`
			StaleReason string `json:"stale_reason"`
		}
	}
	if err := json.Unmarshal([]byte(out), &list); code != 200 || err != nil || len(list.Overrides) != 1 {
		t.Fatalf("list: %d %s", code, out)
	}
	if o := list.Overrides[0]; o.Stale != stale || !strings.Contains(o.StaleReason, want) {
		t.Fatalf("listed %s, want stale %v with a reason naming %q", out, stale, want)
	}
	n := 0
	if stale {
		n = 1
	}
	if _, m := call(t, "GET", srv.admin+"/metrics", ""); !strings.Contains(m, fmt.Sprintf("\ndrip_overrides_stale %d\n", n)) {
		t.Fatalf("metrics, want drip_overrides_stale %d:\n%s", n, grep(m, "drip_overrides"))
	}
}

// TestOverridesStale: an override set for a rule whose algorithm then
// changes (a token bucket's on a rule that became a concurrency rule, and
// the reverse) never applies: the decision API's /v1/acquire and /v1/take
// and the gateway decide with the rule's own limit; the override is listed
// as stale, logged once, counted, until it is replaced or deleted.
func TestOverridesStale(t *testing.T) {
	for _, st := range teststores.Shared() {
		t.Run(st.Name+"/bucket-on-concurrency", func(t *testing.T) {
			srv, gw, path, log, started, finish := staleServers(t, st, staleBucketRule)
			if code, out := admin(t, "PUT", srv.admin+"/v1/admin/overrides/x/acme", `{"rate": 1, "burst": 50}`); code != 200 {
				t.Fatalf("PUT: %d %s", code, out)
			}
			writeFile(t, path, staleConcRule)
			reloadBoth(t, srv, gw)
			code, out := post(t, srv.base+"/v1/acquire", `{"rule": "x", "values": ["acme"]}`)
			var a struct {
				Allowed bool    `json:"allowed"`
				Limit   float64 `json:"limit"`
				Lease   string  `json:"lease"`
			}
			if err := json.Unmarshal([]byte(out), &a); code != 200 || err != nil || !a.Allowed || a.Limit != 1 || a.Lease == "" {
				t.Fatalf("acquire: %d %s, want a slot of the rule's max_in_flight 1, with a lease", code, out)
			}
			if code, out := post(t, srv.base+"/v1/acquire", `{"rule": "x", "values": ["acme"]}`); code != 200 || decision(t, out).Allowed {
				t.Fatalf("second acquire: %d %s, want denied (max_in_flight 1)", code, out)
			}
			if code, out := post(t, srv.base+"/v1/release", `{"rule": "x", "values": ["acme"], "lease": "`+a.Lease+`"}`); code != 200 {
				t.Fatalf("release: %d %s", code, out)
			}

			// Through the gateway: one request in flight holds the one slot.
			done := make(chan int)
			go func() {
				req, _ := http.NewRequest("GET", gw.base+"/slow", nil)
				req.Header.Set("X-Api-Key", "acme")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					done <- 0
					return
				}
				resp.Body.Close()
				done <- resp.StatusCode
			}()
			<-started
			resp, body := gwGet(t, gw.base, "/fast", "acme")
			close(finish)
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("gateway, a second request in flight: %d %s, want 429", resp.StatusCode, body)
			}
			if c := <-done; c != 200 {
				t.Fatalf("the slow request: %d", c)
			}

			staleListed(t, srv, true, "concurrency")
			if err := srv.Reload(); err != nil { // still stale: not logged again
				t.Fatal(err)
			}
			if n := strings.Count(log.String(), "stale"); n != 1 {
				t.Fatalf("logged %d times, want once:\n%s", n, log)
			}
			if code, out := admin(t, "PUT", srv.admin+"/v1/admin/overrides/x/acme", `{"max_in_flight": 2}`); code != 200 {
				t.Fatalf("PUT of a concurrency override: %d %s", code, out)
			}
			staleListed(t, srv, false, "")
		})
		t.Run(st.Name+"/set-elsewhere", func(t *testing.T) {
			// An instance still on the old rules sets a token bucket
			// override: this one learns it stale from its follower.
			srv, _, _, log, _, _ := staleServers(t, st, staleConcRule)
			e := override.Entry{Rule: "x", Values: []string{"acme"}, Key: "x|acme", Limit: drip.Limit{Rate: 1, Period: time.Hour, Burst: 50}}
			if err := override.Set(t.Context(), srv.ost, e); err != nil {
				t.Fatal(err)
			}
			if err := srv.ovr.Refresh(t.Context()); err != nil {
				t.Fatal(err)
			}
			if _, ok := srv.eng.Overrides().Limit("x|acme"); !ok {
				t.Fatal("the override did not reach the instance")
			}
			if code, out := post(t, srv.base+"/v1/acquire", `{"rule": "x", "values": ["acme"]}`); code != 200 || decision(t, out).Burst != 1 {
				t.Fatalf("acquire: %d %s, want the rule's max_in_flight 1", code, out)
			}
			staleListed(t, srv, true, "concurrency")
			if n := strings.Count(log.String(), "stale"); n != 1 {
				t.Fatalf("logged %d times, want once:\n%s", n, log)
			}
		})
		t.Run(st.Name+"/concurrency-on-bucket", func(t *testing.T) {
			srv, gw, path, log, _, _ := staleServers(t, st, staleConcRule)
			if code, out := admin(t, "PUT", srv.admin+"/v1/admin/overrides/x/acme", `{"max_in_flight": 5}`); code != 200 {
				t.Fatalf("PUT: %d %s", code, out)
			}
			writeFile(t, path, staleBucketRule)
			reloadBoth(t, srv, gw)
			for i := range 3 {
				if resp, body := gwGet(t, gw.base, "/", "acme"); resp.StatusCode != 200 {
					t.Fatalf("gateway request %d: %d %s", i, resp.StatusCode, body)
				}
			}
			if resp, body := gwGet(t, gw.base, "/", "acme"); resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("gateway past the rule's burst 3: %d %s, want 429", resp.StatusCode, body)
			}
			code, out := post(t, srv.base+"/v1/take", `{"rule": "x", "values": ["acme"]}`)
			if code != 200 {
				t.Fatalf("take: %d %s", code, out)
			}
			if d := decision(t, out); d.Allowed || d.Burst != 3 {
				t.Fatalf("take of the empty bucket: %s, want denied under burst 3", out)
			}
			staleListed(t, srv, true, "token_bucket")
			if n := strings.Count(log.String(), "stale"); n != 1 {
				t.Fatalf("logged %d times, want once:\n%s", n, log)
			}
			if code, out := admin(t, "DELETE", srv.admin+"/v1/admin/overrides/x/acme", ""); code != 200 {
				t.Fatalf("DELETE: %d %s", code, out)
			}
			if _, m := call(t, "GET", srv.admin+"/metrics", ""); !strings.Contains(m, "\ndrip_overrides_stale 0\n") {
				t.Fatalf("metrics after DELETE:\n%s", grep(m, "drip_overrides"))
			}
		})
	}
}
