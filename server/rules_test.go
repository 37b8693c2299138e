package server

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

// rulesFile writes a rules file with one token bucket rule per name,
// keyed by the x-api-key header, of rate 1 per hour and the given burst:
// over a test nothing refills, so every grant is counted exactly.
func rulesFile(t testing.TB, path string, burst int, names ...string) string {
	t.Helper()
	var rs []string
	for _, n := range names {
		rs = append(rs, fmt.Sprintf(`{"name": %q, "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
		  "algorithm_config": {"rate": 1, "period": "1h", "burst": %d}}`, n, burst))
	}
	body := `{"rules": [` + strings.Join(rs, ",\n") + `]}`
	if path == "" {
		path = filepath.Join(t.TempDir(), "rules.json")
	}
	// Write aside and rename, as editors and ConfigMaps do: the watcher
	// never sees half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// reloadAlternating reloads srv at least n times, pause apart, and on
// until done reports true, alternating between two rules files at path
// that both keep the rule "api" (of burst burst). done lets a test under
// load go on until its clients have made the requests it counts, however
// slowly a loaded machine runs them.
func reloadAlternating(t *testing.T, srv *running, path string, burst, n int, pause time.Duration, done func() bool) {
	t.Helper()
	for i := 0; i < n || !done(); i++ {
		if i%2 == 0 {
			rulesFile(t, path, burst, "api", fmt.Sprint("extra", i))
		} else {
			rulesFile(t, path, burst, "api")
		}
		if err := srv.Reload(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(pause)
	}
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func TestDecisionAPIByRule(t *testing.T) {
	path := rulesFile(t, "", 3, "api")
	// The store decides at a time of the test's: nothing refills between
	// two calls, so every count below is exact.
	st := memstore.New(memstore.WithClock(testclock.New().Now))
	srv := start(t, Config{Rules: path, AdminToken: "t"}, st)
	set, err := rules.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ru, _ := set.Rule("api")
	key := ru.Key([]string{"k1"})

	code, out := post(t, srv.base+"/v1/take", `{"rule": "api", "values": ["k1"]}`)
	if d := decision(t, out); code != 200 || !d.Allowed || d.Remaining != 2 || d.Burst != 3 {
		t.Fatalf("take by rule: %d %s", code, out)
	}
	// The same bucket by a map of limit key to value (header names in any
	// case), and straight from the store under the rule's key.
	code, out = post(t, srv.base+"/v1/take", `{"rule": "api", "values": {"header:X-API-Key": "k1"}, "cost": 2}`)
	if d := decision(t, out); code != 200 || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("take by rule with a map: %d %s", code, out)
	}
	d, err := storetest.Apply(t.Context(), st, bucket.Peek, time.Time{}, drip.Request{Key: key, Limit: ru.Limit, Cost: 0})
	if err != nil || d.Tokens != 0 {
		t.Fatalf("the rule's bucket %q in the store: %+v %v, want empty", key, d, err)
	}
	// An inline request naming the rule's bucket key reaches a bucket of
	// its own: a caller who picks the limit cannot refund, drain or reset
	// the rule's buckets.
	body, _ := json.Marshal(map[string]any{"key": key, "cost": 3, "limit": map[string]any{"rate": 1, "burst": 1000}})
	if code, out := post(t, srv.base+"/v1/refund", string(body)); code != 200 {
		t.Fatalf("inline refund: %d %s", code, out)
	}
	if code, out := post(t, srv.base+"/v1/reset", `{"key": "`+key+`"}`); code != 200 {
		t.Fatalf("inline reset: %d %s", code, out)
	}
	if code, out := post(t, srv.base+"/v1/peek", `{"rule": "api", "values": ["k1"]}`); code != 200 || decision(t, out).Allowed {
		t.Fatalf("an inline request reached the rule's bucket: %d %s", code, out)
	}
	// A multi-take mixing a rule and an inline limit.
	code, out = post(t, srv.base+"/v1/take", `{"requests": [{"rule": "api", "values": ["k2"]}, {"key": "x", `+lim+`}]}`)
	var m drip.Multi
	if err := json.Unmarshal([]byte(out), &m); code != 200 || err != nil || !m.Allowed || m.Decisions[0].Remaining != 2 {
		t.Fatalf("multi-take by rule: %d %s", code, out)
	}
	// Reset by rule.
	if code, out := post(t, srv.base+"/v1/reset", `{"rule": "api", "values": ["k1"]}`); code != 200 {
		t.Fatalf("reset by rule: %d %s", code, out)
	}
	if code, out := post(t, srv.base+"/v1/peek", `{"rule": "api", "values": ["k1"]}`); code != 200 || decision(t, out).Remaining != 2 {
		t.Fatalf("peek after reset: %d %s", code, out)
	}

	for _, tc := range []struct {
		body string
		code int
		msg  string
	}{
		{`{"rule": "api"}`, 400, `needs values for [header:x-api-key]`},
		{`{"rule": "api", "values": []}`, 400, "needs 1 values"},
		{`{"rule": "api", "values": ["a", "b"]}`, 400, "needs 1 values"},
		{`{"rule": "api", "values": [""]}`, 400, "is empty"},
		{`{"rule": "api", "values": [1]}`, 400, "list of strings"},
		{`{"rule": "api", "values": "k1"}`, 400, "want a list of strings"},
		{`{"rule": "api", "values": {"header:x-other": "k1"}}`, 400, "needs a value for header:x-api-key"},
		{`{"rule": "api", "values": {"header:x-api-key": "k1", "path": "/"}}`, 400, "no limit key path"},
		{`{"rule": "api", "values": ["k1"], "limit": {"rate": 1}}`, 400, "instead of key and limit"},
		{`{"rule": "api", "values": ["k9"], "cost": 4}`, 400, "cost exceeds burst"},
		{`{"rule": "nope", "values": ["k1"]}`, 404, `unknown rule`},
	} {
		code, out := post(t, srv.base+"/v1/take", tc.body)
		if code != tc.code || !strings.Contains(out, tc.msg) {
			t.Errorf("%s: %d %s, want %d with %q", tc.body, code, out, tc.code, tc.msg)
		}
	}

	// The admin API inspects and resets the same bucket.
	auth := []string{"Authorization", "Bearer t"}
	post(t, srv.base+"/v1/take", `{"rule": "api", "values": ["k3"]}`)
	code, out = call(t, "GET", srv.admin+"/v1/admin/bucket?rule=api&value=k3", "", auth...)
	var in struct {
		Rule, Key string
		Decision  drip.Decision
	}
	if err := json.Unmarshal([]byte(out), &in); code != 200 || err != nil || in.Key != ru.Key([]string{"k3"}) || in.Decision.Remaining != 2 || in.Decision.Tokens != 2 {
		t.Fatalf("inspect: %d %s", code, out)
	}
	code, out = call(t, "GET", srv.admin+"/v1/admin/bucket?rule=api&key="+ru.Key([]string{"k3"}), "", auth...)
	if err := json.Unmarshal([]byte(out), &in); code != 200 || err != nil || in.Decision.Remaining != 2 || in.Decision.Tokens != 2 {
		t.Fatalf("inspect by key: %d %s", code, out)
	}
	for _, bad := range []string{"", "?rule=nope&value=x", "?rule=api", "?rule=api&value=a&value=b"} {
		if code, out := call(t, "GET", srv.admin+"/v1/admin/bucket"+bad, "", auth...); code/100 != 4 {
			t.Errorf("inspect %q: %d %s, want 4xx", bad, code, out)
		}
	}
	code, out = call(t, "POST", srv.admin+"/v1/admin/reset", `{"rule": "api", "values": ["k3"]}`, auth...)
	if code != 200 {
		t.Fatalf("admin reset: %d %s", code, out)
	}
	code, out = call(t, "GET", srv.admin+"/v1/admin/bucket?rule=api&value=k3", "", auth...)
	if err := json.Unmarshal([]byte(out), &in); code != 200 || err != nil || in.Decision.Tokens != 3 { // full again
		t.Fatalf("inspect after admin reset: %d %s", code, out)
	}
	code, out = call(t, "GET", srv.admin+"/v1/admin/rules", "", auth...)
	if code != 200 || !strings.Contains(out, `"name":"api"`) || !strings.Contains(out, `"limit_keys":["header:x-api-key"]`) {
		t.Fatalf("admin rules: %d %s", code, out)
	}
}

// TestDefaultRules: with no rules file the built-in rules are in force and
// the decision API reaches them by name.
func TestDefaultRules(t *testing.T) {
	srv := start(t, Config{}, memstore.New())
	code, out := post(t, srv.base+"/v1/take", `{"rule": "per-ip", "values": ["192.0.2.1"]}`)
	if d := decision(t, out); code != 200 || !d.Allowed || d.Burst != 20 {
		t.Fatalf("take on the default per-ip rule: %d %s", code, out)
	}
	// An IPv6 client is keyed by its /64, as the middleware keys it.
	post(t, srv.base+"/v1/take", `{"rule": "per-ip", "values": ["2001:db8:1:2::1"]}`)
	code, out = post(t, srv.base+"/v1/take", `{"rule": "per-ip", "values": {"ip:address": "2001:db8:1:2:ffff::9"}}`)
	if d := decision(t, out); code != 200 || d.Remaining != 18 {
		t.Fatalf("second take in one IPv6 /64: %d %s, want 18 remaining", code, out)
	}
	if err := srv.Reload(); err != nil {
		t.Fatalf("reload of the built-in rules: %v", err)
	}
}

func TestReloadBadFileKeepsRules(t *testing.T) {
	path := rulesFile(t, "", 5, "api")
	srv := start(t, Config{Rules: path, AdminToken: "t", WatchEvery: -1}, memstore.New())
	auth := []string{"Authorization", "Bearer t"}
	post(t, srv.base+"/v1/take", `{"rule": "api", "values": ["k"]}`)

	writeFile(t, path, `{"rules": [{"name": "api", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
		"algorithm_config": {"rps": 10, "burst": 0, "colour": "blue"}}]}`)
	code, out := call(t, "POST", srv.admin+"/v1/admin/reload", "", auth...)
	if code != 422 || !strings.Contains(out, "rules[0].algorithm_config.burst: must be > 0") || !strings.Contains(out, "colour") {
		t.Fatalf("reload of a bad file: %d %s, want 422 with every problem", code, out)
	}
	// The old rules and the bucket stay.
	code, out = post(t, srv.base+"/v1/take", `{"rule": "api", "values": ["k"]}`)
	if d := decision(t, out); code != 200 || d.Remaining != 3 || d.Burst != 5 {
		t.Fatalf("take after a bad reload: %d %s", code, out)
	}
	_, metrics := call(t, "GET", srv.admin+"/metrics", "")
	for _, want := range []string{`drip_rules_reloads_total{result="error"} 1`, "drip_rules_last_reload_ok 0", "drip_rules_loaded 1"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q:\n%s", want, grep(metrics, "drip_rules"))
		}
	}
	// A missing file too.
	os.Remove(path)
	if err := srv.Reload(); err == nil {
		t.Fatal("reload of a missing file succeeded")
	}
	// A good file: the new rule is in force, the old bucket kept.
	rulesFile(t, path, 5, "api", "other")
	if code, out := call(t, "POST", srv.admin+"/v1/admin/reload", "", auth...); code != 200 {
		t.Fatalf("reload of a good file: %d %s", code, out)
	}
	code, out = post(t, srv.base+"/v1/take", `{"rule": "api", "values": ["k"]}`)
	if d := decision(t, out); code != 200 || d.Remaining != 2 {
		t.Fatalf("take after a good reload: %d %s, want the bucket kept", code, out)
	}
	if code, out := post(t, srv.base+"/v1/take", `{"rule": "other", "values": ["k"]}`); code != 200 {
		t.Fatalf("the new rule: %d %s", code, out)
	}
	_, metrics = call(t, "GET", srv.admin+"/metrics", "")
	for _, want := range []string{`drip_rules_reloads_total{result="ok"} 1`, "drip_rules_last_reload_ok 1", "drip_rules_loaded 2"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q:\n%s", want, grep(metrics, "drip_rules"))
		}
	}
}

func TestStartWithBadRules(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.json")
	writeFile(t, path, `{"rules": [{"name": "x"}]}`)
	if _, err := New(Config{Rules: path}, memstore.New()); err == nil {
		t.Fatal("New with a bad rules file succeeded")
	}
}

// TestReloadOnFileChange: the watcher picks up a new file by itself.
func TestReloadOnFileChange(t *testing.T) {
	path := rulesFile(t, "", 5, "api")
	srv, poll := startWatched(t, Config{Rules: path}, memstore.New())
	poll() // nothing changed: no reload
	_, metrics := call(t, "GET", srv.admin+"/metrics", "")
	if !strings.Contains(metrics, `drip_rules_reloads_total{result="ok"} 0`) {
		t.Fatalf("an unchanged file was reloaded:\n%s", grep(metrics, "drip_rules"))
	}
	rulesFile(t, path, 5, "api", "added")
	poll()
	if code, out := post(t, srv.base+"/v1/peek", `{"rule": "added", "values": ["k"]}`); code != 200 {
		t.Fatalf("the changed rules file was not reloaded: %d %s", code, out)
	}
	_, metrics = call(t, "GET", srv.admin+"/metrics", "")
	if !strings.Contains(metrics, `drip_rules_reloads_total{result="ok"} 1`) {
		t.Fatalf("one change, not one reload:\n%s", grep(metrics, "drip_rules"))
	}
	// A bad file is tried once, reported, and the rules stay.
	writeFile(t, path, `{"rules": [}`)
	poll()
	_, metrics = call(t, "GET", srv.admin+"/metrics", "")
	if !strings.Contains(metrics, `drip_rules_reloads_total{result="error"} 1`) {
		t.Fatalf("the bad rules file was not reported:\n%s", grep(metrics, "drip_rules"))
	}
	poll()
	poll() // more polls: still one error
	_, metrics = call(t, "GET", srv.admin+"/metrics", "")
	if !strings.Contains(metrics, `drip_rules_reloads_total{result="error"} 1`) {
		t.Errorf("a bad file was reloaded again and again:\n%s", grep(metrics, "drip_rules"))
	}
	if code, out := post(t, srv.base+"/v1/peek", `{"rule": "added", "values": ["k"]}`); code != 200 {
		t.Fatalf("rules lost after a bad file: %d %s", code, out)
	}
}

// TestReloadUnderLoad: requests keep deciding while the rules are
// reloaded again and again; since buckets are keyed by rule name, no state
// is lost: a burst of 20 that never refills grants exactly 20.
func TestReloadUnderLoad(t *testing.T) {
	const burst = 20
	path := rulesFile(t, "", burst, "api")
	srv := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	var granted, denied atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, out := post(t, srv.base+"/v1/take", `{"rule": "api", "values": ["shared"]}`)
				if code != 200 {
					t.Errorf("take during reloads: %d %s", code, out)
					return
				}
				if decision(t, out).Allowed {
					granted.Add(1)
				} else {
					denied.Add(1)
				}
			}
		})
	}
	reloadAlternating(t, srv, path, burst, 50, 2*time.Millisecond, func() bool { return denied.Load() > 0 })
	close(stop)
	wg.Wait()
	if g := granted.Load(); g != burst || denied.Load() == 0 {
		t.Fatalf("granted %d (denied %d) across 50 reloads, want exactly %d", g, denied.Load(), burst)
	}
}
