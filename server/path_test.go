package server

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/pathtest"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

// TestGatewayPathSpellings: the gateway meets a rule however its path or
// method is spelled (pathtest.Cases), or refuses the ambiguous spellings
// with a 400; the upstream sees only the requests no rule stopped.
func TestGatewayPathSpellings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, pathtest.Rules)
	up := newUpstream(t)
	gw := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1}, memstore.New())
	for _, c := range append(pathtest.Drain, pathtest.Cases...) {
		resp, body := pathtest.Send(t, gw.base, c.Method, c.Target)
		if resp.StatusCode != c.Want {
			t.Errorf("%s %s: %d %q, want %d", c.Method, c.Target, resp.StatusCode, body, c.Want)
		} else if c.Want == 400 && !strings.Contains(body, `"reason":"ambiguous_path"`) {
			t.Errorf("%s %s: 400 %q: want the reason ambiguous_path", c.Method, c.Target, body)
		}
	}
	if n := up.hits.Load(); n != 2+5 {
		t.Errorf("the upstream saw %d requests, want 7 (the drain and the allowed ones)", n)
	}
}

// TestForwardAuthPathSpellings: forward auth reads the forwarded target
// and method as the gateway reads a request's (pathtest.Cases), under the
// headers of Traefik and Caddy (X-Forwarded-Method, -Uri) and of nginx
// (X-Original-Method, -URI, asking for deny_status=403: the refusal's 400
// then rides in Drip-Status, as a denial's 429 does).
func TestForwardAuthPathSpellings(t *testing.T) {
	for _, nginx := range []bool{false, true} {
		t.Run(map[bool]string{false: "X-Forwarded", true: "X-Original"}[nginx], func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rules.json")
			writeFile(t, path, pathtest.Rules)
			srv := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
			for _, c := range append(pathtest.Drain, pathtest.Cases...) {
				query, hdr := "", []string(nil)
				if nginx {
					query = "?deny_status=403"
					hdr = []string{"X-Forwarded-Method", "", "X-Forwarded-Uri", "", "X-Original-Method", c.Method, "X-Original-URI", c.Target}
				}
				resp, body := ask(t, srv.base, query, c.Method, c.Target, hdr...)
				status := resp.StatusCode
				if nginx && status == 403 {
					status, _ = strconv.Atoi(resp.Header.Get("Drip-Status"))
				}
				if status != c.Want {
					t.Errorf("%s %s: %d (Drip-Status %q) %q, want %d", c.Method, c.Target, resp.StatusCode, resp.Header.Get("Drip-Status"), body, c.Want)
				} else if c.Want == 400 && !strings.Contains(body, `"reason":"ambiguous_path"`) {
					t.Errorf("%s %s: 400 %q: want the reason ambiguous_path", c.Method, c.Target, body)
				}
			}
		})
	}
}

// TestDecisionAPIPathKeys: the decision API keys a path and a method as
// the middleware does (folded, upper case), so that a rule keyed on them
// names the very bucket the gateway's requests use, however the caller
// spells them; with exact_paths the path keeps its case.
func TestDecisionAPIPathKeys(t *testing.T) {
	for _, exact := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "rules.json")
		writeFile(t, path, `{"exact_paths": `+strconv.FormatBool(exact)+`, "rules": [{"name": "pages", "limit_keys": ["method", "path"],
		  "algorithm_config": {"rate": 1, "period": "1h", "burst": 3}}]}`)
		st := memstore.New(memstore.WithClock(testclock.New().Now))
		srv := start(t, Config{Rules: path, WatchEvery: -1}, st)
		for _, values := range []string{`["get", "/Docs"]`, `{"path": "/DOCS", "method": "Get"}`} {
			if code, out := post(t, srv.base+"/v1/take", `{"rule": "pages", "values": `+values+`}`); code != 200 || !decision(t, out).Allowed {
				t.Fatalf("exact_paths %v: take %s: %d %s", exact, values, code, out)
			}
		}
		set, err := rules.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		ru, _ := set.Rule("pages")
		for p, want := range map[string]float64{"/docs": 1, "/Docs": 3, "/DOCS": 3} {
			if exact {
				want = map[string]float64{"/docs": 3, "/Docs": 2, "/DOCS": 2}[p]
			}
			d, err := storetest.Apply(t.Context(), st, bucket.Peek, time.Time{}, drip.Request{Key: ru.Key([]string{"GET", p}), Limit: ru.Limit})
			if err != nil || d.Tokens != want {
				t.Errorf("exact_paths %v: the bucket of GET %s holds %v (%v), want %v", exact, p, d.Tokens, err, want)
			}
		}
	}
}
