package server

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/store/memstore"
)

// shadowRules: "sh" (shadow) and "en" (enforced) of one token an hour,
// a shadow concurrency rule of one slot, and an Envoy limit in shadow
// mode of one request an hour.
const shadowRules = `{"trusted_proxies": ["127.0.0.1/32"], "rules": [
  {"name": "sh", "mode": "shadow", "limit_keys": ["header:x-user"], "algorithm_config": {"rate": 1, "period": "1h"}},
  {"name": "en", "limit_keys": ["header:x-team"], "algorithm_config": {"rate": 1, "period": "1h"}},
  {"name": "slots", "mode": "shadow", "limit_keys": ["header:x-slot"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1, "lease_ttl": "1h"}}]}`

const shadowEnvoy = `domain: edge
descriptors:
  - key: user
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// TestShadowNeverDenies: a shadow rule never denies, through each door
// that decides by rule: the decision API by rule name (take, peek,
// acquire, alone and in a multi-take beside an enforced rule), the
// gateway, forward auth and Envoy's service; its decisions are counted
// in shadow mode, its denials as shadow denials.
func TestShadowNeverDenies(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.json"), shadowRules)
	writeFile(t, filepath.Join(dir, "edge.yaml"), shadowEnvoy)
	up := newUpstream(t)
	st := memstore.New(memstore.WithClock(testclock.New().Now)) // nothing refills
	gw := start(t, Config{Rules: dir, Upstream: up.URL, WatchEvery: -1}, st)
	api := start(t, Config{Rules: dir, WatchEvery: -1}, st)

	allowed := func(what, body string) drip.Decision {
		t.Helper()
		code, out := post(t, api.base+"/v1/"+what, body)
		var d struct {
			drip.Decision
			Lease string `json:"lease"`
		}
		if err := json.Unmarshal([]byte(out), &d); code != 200 || err != nil || !d.Allowed {
			t.Fatalf("%s %s: %d %s: a shadow rule denied", what, body, code, out)
		}
		return d.Decision
	}
	// Alone: three takes of a bucket of one, and a peek of it empty.
	for range 3 {
		allowed("take", `{"rule": "sh", "values": ["u1"]}`)
	}
	if d := allowed("peek", `{"rule": "sh", "values": ["u1"]}`); d.Remaining != 0 || d.RetryAfter != 0 {
		t.Errorf("peek of an empty shadow bucket: %+v, want its state (remaining 0) and no wait", d)
	}
	// Beside an enforced rule: the enforced one decides, and is taken.
	for i, want := range []bool{true, false} {
		code, out := post(t, api.base+"/v1/take", `{"requests": [{"rule": "en", "values": ["t1"]}, {"rule": "sh", "values": ["u1"]}]}`)
		var m drip.Multi
		if err := json.Unmarshal([]byte(out), &m); code != 200 || err != nil || m.Allowed != want || !m.Decisions[1].Allowed {
			t.Fatalf("multi-take %d: %d %s: want allowed %v, the shadow request allowed", i, code, out, want)
		}
	}
	// A shadow concurrency rule: the second acquire is let through, and
	// holds no lease, since its slot was not taken.
	code, out := post(t, api.base+"/v1/acquire", `{"rule": "slots", "values": ["s"]}`)
	var first struct{ Lease string }
	if json.Unmarshal([]byte(out), &first); code != 200 || first.Lease == "" {
		t.Fatalf("first acquire: %d %s", code, out)
	}
	code, out = post(t, api.base+"/v1/acquire", `{"rule": "slots", "values": ["s"]}`)
	var second struct {
		Allowed bool
		Lease   string
	}
	if json.Unmarshal([]byte(out), &second); code != 200 || !second.Allowed || second.Lease != "" {
		t.Fatalf("second acquire of a shadow rule of one slot: %d %s, want allowed without a lease", code, out)
	}

	// The gateway and forward auth: the shadow rule alone applies to
	// x-user u2; three requests pass each door.
	for i := range 3 {
		req, _ := http.NewRequest("GET", gw.base+"/x", nil)
		req.Header.Set("X-User", "u2")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("gateway request %d: %d", i, resp.StatusCode)
		}
		if resp, body := ask(t, api.base, "", "GET", "/x", "X-User", "u3"); resp.StatusCode != 200 {
			t.Fatalf("forward auth request %d: %d %s", i, resp.StatusCode, body)
		}
		if code, out := call(t, "POST", api.admin+"/json", `{"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": "u4"}]}]}`); code != 200 {
			t.Fatalf("Envoy request %d: %d %s", i, code, out)
		}
	}

	// On the API's server: its own takes (1 allowed, then 2 denied
	// alone and 2 in the multi-takes) and forward auth's (1 and 2).
	counts := map[string]float64{
		"drip_decisions_total{mode=shadow,outcome=allowed,rule=sh}":              2,
		"drip_decisions_total{mode=shadow,outcome=denied,rule=sh}":               6,
		"drip_shadow_denials_total{rule=sh}":                                     6,
		"drip_decisions_total{mode=shadow,outcome=allowed,rule=slots}":           1,
		"drip_decisions_total{mode=shadow,outcome=denied,rule=slots}":            1,
		"drip_shadow_denials_total{rule=slots}":                                  1,
		"drip_decisions_total{mode=shadow,outcome=allowed,rule=envoy:edge.user}": 1,
		"drip_decisions_total{mode=shadow,outcome=denied,rule=envoy:edge.user}":  2,
		"drip_shadow_denials_total{rule=envoy:edge.user}":                        2,
	}
	shadowOnly(t, decisionSeries(scrape(t, api.admin)), counts)
	shadowOnly(t, decisionSeries(scrape(t, gw.admin)), map[string]float64{
		"drip_decisions_total{mode=shadow,outcome=allowed,rule=sh}": 1,
		"drip_decisions_total{mode=shadow,outcome=denied,rule=sh}":  2,
		"drip_shadow_denials_total{rule=sh}":                        2,
	})
}

// shadowOnly checks the counts of got against want, and that no shadow
// rule of shadowRules counted a decision in enforce mode.
func shadowOnly(t *testing.T, got, want map[string]float64) {
	t.Helper()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %v, want %v", k, got[k], w)
		}
	}
	for k, v := range got {
		for _, rule := range []string{"sh", "slots"} {
			if v != 0 && strings.HasPrefix(k, "drip_decisions_total{mode=enforce,") && strings.HasSuffix(k, ",rule="+rule+"}") {
				t.Errorf("%s = %v: a shadow rule counted as enforced", k, v)
			}
		}
	}
}
