package server

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/topkeys"
)

// TestAdminTop: the admin API lists who the decision API denied and
// who is nearest the limit, behind the token; denials are logged with
// the key hashed, and the lines and the denials left out are counted.
func TestAdminTop(t *testing.T) {
	var logs testserver.LockedBuffer
	srv := start(t, Config{Rules: rulesFile(t, "", 3, "api"), WatchEvery: -1, AdminToken: adminToken,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, memstore.New())
	take := func(v string) {
		if code, out := post(t, srv.base+"/v1/take", `{"rule": "api", "values": [`+jsonString(v)+`]}`); code != 200 && code != 429 {
			t.Fatalf("take: %d %s", code, out)
		}
	}
	for range 5 {
		take("a")
	}
	take("b")

	if code, _ := call(t, "GET", srv.admin+"/v1/admin/top", ""); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d, want 401", code)
	}
	for _, q := range []string{"window=2m", "n=0", "n=1000", "n=x"} {
		if code, out := admin(t, "GET", srv.admin+"/v1/admin/top?"+q, ""); code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", q, code, out)
		}
	}
	w := oneRule(t, srv, "window=1m&n=5")
	want := topkeys.Window{Rule: "api", Window: "1m", Requests: 6, Denials: 2,
		TopRequests:   []topkeys.Count{{Key: "api|a", Count: 5}, {Key: "api|b", Count: 1}},
		TopDenied:     []topkeys.Count{{Key: "api|a", Count: 2}},
		Near:          []topkeys.Near{{Key: "api|a", Tokens: 0, Limit: 3, Left: 0}},
		TotalRequests: 6, TotalDenials: 2}
	w.Seconds, w.Logged, w.Unlogged = 0, 0, 0
	if len(w.Near) == 1 && w.Near[0].Tokens < 0.01 { // it refilled a little since
		w.Near[0].Tokens, w.Near[0].Left = 0, 0
	}
	g, _ := json.Marshal(w)
	x, _ := json.Marshal(want)
	if string(g) != string(x) {
		t.Errorf("top\n%s\nwant\n%s", g, x)
	}

	// One or two lines (a second may pass between the denials on a
	// loaded machine), with the key hashed; every denial counted.
	if n := strings.Count(logs.String(), `"msg":"drip: denied"`); n < 1 || n > 2 {
		t.Errorf("%d denial lines:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "api|a") || !strings.Contains(logs.String(), topkeys.KeyHash("api|a")) {
		t.Errorf("the denial log does not show the key hashed:\n%s", logs.String())
	}
	_, metrics := call(t, "GET", srv.admin+"/metrics", "")
	var sum int
	for _, name := range []string{"drip_denial_log_lines_total", "drip_denial_log_unlogged_total"} {
		m := regexp.MustCompile(name + `\{rule="api"\} (\d+)`).FindStringSubmatch(metrics)
		if m == nil {
			t.Fatalf("no %s in\n%s", name, metrics)
		}
		n, _ := strconv.Atoi(m[1])
		sum += n
	}
	if sum != 2 {
		t.Errorf("the denial log counted %d denials, want 2", sum)
	}
}

// TestUI: the admin page's files are served with a policy that lets the
// browser load nothing from elsewhere, and name nothing from elsewhere;
// without an admin token there is no page.
func TestUI(t *testing.T) {
	srv := start(t, Config{Rules: rulesFile(t, "", 3, "api"), WatchEvery: -1, AdminToken: adminToken}, memstore.New())
	for _, f := range []string{"", "app.js", "style.css"} {
		r, err := http.Get(srv.admin + "/ui/" + f)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 200 || r.Header.Get("Content-Security-Policy") != uiPolicy {
			t.Errorf("/ui/%s: %d, policy %q", f, r.StatusCode, r.Header.Get("Content-Security-Policy"))
		}
		// The one outside name: SVG's namespace, which loads nothing.
		body := strings.ReplaceAll(string(b), "'http://www.w3.org/2000/svg'", "")
		if strings.Contains(body, "http://") || strings.Contains(body, "https://") || strings.Contains(body, "//cdn") {
			t.Errorf("/ui/%s names something outside the page", f)
		}
	}
	off := start(t, Config{Rules: rulesFile(t, "", 3, "api"), WatchEvery: -1}, memstore.New())
	if code, _ := call(t, "GET", off.admin+"/ui/", ""); code != http.StatusNotFound {
		t.Errorf("without an admin token: %d, want 404", code)
	}
}

// TestAdminTopEnvoy: Envoy's limits are followed as envoy:<label>.
func TestAdminTopEnvoy(t *testing.T) {
	dir := t.TempDir()
	envoyFile(t, filepath.Join(dir, "edge.yaml"), 2)
	srv := start(t, Config{Rules: dir, WatchEvery: -1, AdminToken: adminToken}, memstore.New())
	for range 3 {
		post(t, srv.admin+"/json", edgeRequest)
	}
	w := oneRule(t, srv, "")
	if w.Rule != "envoy:edge.remote_address" || w.Requests != 3 || w.Denials != 1 ||
		len(w.TopDenied) != 1 || !strings.Contains(w.TopDenied[0].Key, "192.0.2.1") || w.TopDenied[0].Count != 1 {
		t.Errorf("top %+v", w)
	}
}

// oneRule asks srv's admin API for the top keys (query: its query
// string) and returns the one rule's view it must hold.
func oneRule(t *testing.T, srv *running, query string) topkeys.Window {
	t.Helper()
	got := topView(t, srv, query)
	if len(got.Rules) != 1 {
		t.Fatalf("rules %+v", got.Rules)
	}
	return got.Rules[0]
}

// TestAdminTopFleet: two instances on one shared store each see their
// own traffic alone (scope=instance) and, merged, the fleet's: each
// key's count the sum of both within its stated error, with how many
// instances and how stale; an instance stopped drops out of the view
// once its summaries' ttl has passed.
func TestAdminTopFleet(t *testing.T) {
	for _, st := range teststores.Shared() {
		t.Run(st.Name, func(t *testing.T) {
			shared := st.Open(t)
			cfg := Config{Rules: rulesFile(t, "", 3, "api"), WatchEvery: -1, AdminToken: adminToken}
			short := func(s *Server) { s.topTTL = time.Second }
			a, b := startWith(t, cfg, shared, short), startWith(t, cfg, shared, short)
			take := func(srv *running, v string, n int) {
				for range n {
					if code, out := post(t, srv.base+"/v1/take", `{"rule": "api", "values": [`+jsonString(v)+`]}`); code != 200 && code != 429 {
						t.Fatalf("take: %d %s", code, out)
					}
				}
			}
			take(a, "a", 5)
			take(a, "b", 1)
			take(b, "a", 3)
			take(b, "c", 2)
			view := func(srv *running, query string) top { return topView(t, srv, query) }
			requests := func(v top) map[string]uint64 {
				t.Helper()
				m := map[string]uint64{}
				if len(v.Rules) != 1 {
					t.Fatalf("rules %+v", v.Rules)
				}
				for _, c := range v.Rules[0].TopRequests {
					if c.Error != 0 { // three keys: no counter was taken over
						t.Errorf("%s: error %d", c.Key, c.Error)
					}
					m[c.Key] = c.Count
				}
				return m
			}
			if code, _ := admin(t, "GET", a.admin+"/v1/admin/top?scope=all", ""); code != http.StatusBadRequest {
				t.Errorf("scope=all: %d, want 400", code)
			}
			alone := view(b, "scope=instance")
			if got := requests(alone); alone.Scope != "instance" || alone.Instances != 1 || len(got) != 2 || got["api|a"] != 3 || got["api|c"] != 2 {
				t.Errorf("b alone: %+v", alone)
			}
			// Before b puts its summaries, a's fleet is a alone.
			if v := view(a, ""); v.Scope != "fleet" || v.Instances != 1 || requests(v)["api|a"] != 5 {
				t.Errorf("a's fleet before b put: %+v", v)
			}
			b.putTop(t.Context())
			a.putTop(t.Context())
			for _, srv := range []*running{a, b} {
				v := view(srv, "n=10")
				got := requests(v)
				if v.Scope != "fleet" || v.Instances != 2 || v.StaleSeconds < 0 || v.StaleSeconds > 30 ||
					len(got) != 3 || got["api|a"] != 8 || got["api|b"] != 1 || got["api|c"] != 2 ||
					v.Rules[0].Requests != 11 {
					t.Errorf("the fleet from %s: %+v", srv.instance, v)
				}
				// a's 5 takes of a bucket of 3, then b's 3: 2 + 3 denials.
				if d := v.Rules[0].TopDenied; len(d) != 1 || d[0].Key != "api|a" || d[0].Count != 5 {
					t.Errorf("the fleet's denials from %s: %+v", srv.instance, d)
				}
			}
			if v := view(a, "rule=other"); len(v.Rules) != 0 {
				t.Errorf("rule=other: %+v", v.Rules)
			}
			// b stops: its summaries drop out after their ttl (1 s here).
			if err := b.stop(); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(time.Minute)
			for {
				v := view(a, "")
				if v.Instances == 1 {
					if got := requests(v); got["api|a"] != 5 || got["api|c"] != 0 {
						t.Errorf("after b dropped out: %+v", got)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("b's summaries still merged a minute after b stopped: %+v", v)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// topView asks srv's admin API for the top keys (query: its query
// string).
func topView(t *testing.T, srv *running, query string) top {
	t.Helper()
	code, out := admin(t, "GET", srv.admin+"/v1/admin/top?"+query, "")
	if code != 200 {
		t.Fatalf("top: %d %s", code, out)
	}
	var got top
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	return got
}
