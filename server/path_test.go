package server

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/pathtest"
	"github.com/driplimit/drip/store/memstore"
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
