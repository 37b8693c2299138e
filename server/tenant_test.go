package server

import (
	"encoding/json"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/memstore"
)

const tenantRules = `{"jwt": {"verify": false}, "rules": [
  {"name": "enterprise", "group": "plan", "limit_keys": ["header:x-api-key"], "match": {"jwt:plan": "enterprise"},
   "algorithm_config": {"rate": 100, "period": "1h", "burst": 100}},
  {"name": "free", "group": "plan", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 3, "period": "1h", "burst": 3}},
  {"name": "per-ip", "limit_keys": ["ip:address"], "algorithm_config": {"rate": 5, "period": "1h", "burst": 5}},
  {"name": "conc", "algorithm": "concurrency", "limit_keys": ["header:x-api-key"], "algorithm_config": {"max_in_flight": 2}}]}`

// TestAdminTenant: one admin call shows every rule a request carrying
// some values falls under, its bucket as the decision API sees it, the
// override in force and the slots held; and takes nothing.
func TestAdminTenant(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	if err := os.WriteFile(path, []byte(tenantRules), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := start(t, Config{Rules: path, WatchEvery: -1, AdminToken: adminToken}, memstore.New())
	for _, b := range []string{`{"rule": "free", "values": ["k1"]}`, `{"rule": "free", "values": ["k1"]}`} {
		if code, out := post(t, srv.base+"/v1/take", b); code != 200 {
			t.Fatalf("take: %d %s", code, out)
		}
	}
	if code, out := post(t, srv.base+"/v1/acquire", `{"rule": "conc", "values": ["k1"]}`); code != 200 {
		t.Fatalf("acquire: %d %s", code, out)
	}
	if code, out := admin(t, "PUT", srv.admin+"/v1/admin/overrides/per-ip/203.0.113.7", `{"rate": 50, "burst": 50}`); code != 200 {
		t.Fatalf("override: %d %s", code, out)
	}
	ask := `{"ip": "203.0.113.7", "headers": {"X-API-Key": "k1"}}`
	picture := func(ask string) map[string]tenantRule {
		t.Helper()
		code, out := admin(t, "POST", srv.admin+"/v1/admin/tenant", ask)
		if code != 200 {
			t.Fatalf("tenant: %d %s", code, out)
		}
		var got struct{ Rules []tenantRule }
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatal(err)
		}
		m := map[string]tenantRule{}
		for _, r := range got.Rules {
			m[r.Rule] = r
		}
		return m
	}
	var got map[string]tenantRule
	for range 2 { // a lookup takes nothing: the second sees the same
		got = picture(ask)
	}
	if r := got["enterprise"]; r.Applies || !strings.Contains(r.Why, "match") {
		t.Errorf("enterprise: %+v", r)
	}
	peek := func(rule, v string) drip.Decision {
		code, out := post(t, srv.base+"/v1/peek", `{"rule": "`+rule+`", "values": [`+jsonString(v)+`], "cost": 0}`)
		if code != 200 {
			t.Fatalf("peek: %d %s", code, out)
		}
		return decision(t, out)
	}
	for _, c := range []struct{ rule, value, key, from string }{
		{"free", "k1", "free|k1", "rule"},
		{"per-ip", "203.0.113.7", "per-ip|203.0.113.7", "override"},
	} {
		r := got[c.rule]
		if !r.Applies || r.Key != c.key || r.LimitFrom != c.from || r.Decision == nil {
			t.Errorf("%s: %+v", c.rule, r)
			continue
		}
		// The same bucket, read a moment apart: it refilled a little.
		if want, d := peek(c.rule, c.value), *r.Decision; d.Allowed != want.Allowed || d.Remaining != want.Remaining ||
			d.Burst != want.Burst || math.Abs(d.Tokens-want.Tokens) > 0.01 || (d.ResetAfter-want.ResetAfter).Abs() > 30*time.Second {
			t.Errorf("%s: the lookup says %+v, the decision API %+v", c.rule, *r.Decision, want)
		}
	}
	if r := got["free"]; r.Decision.Remaining != 1 {
		t.Errorf("free: remaining %d, want 1", r.Decision.Remaining)
	}
	if r := got["per-ip"]; r.Override == nil || r.Stale != "" || r.Limit.Burst != 50 || r.Decision.Remaining != 50 {
		t.Errorf("per-ip: %+v", r)
	}
	if r := got["conc"]; r.InFlight == nil || *r.InFlight != 1 {
		t.Errorf("conc: %+v", r)
	}

	// A claim moves the request to the other tier of the group.
	got = picture(`{"headers": {"x-api-key": "k1"}, "claims": {"plan": "enterprise"}}`)
	if !got["enterprise"].Applies || got["free"].Applies || got["per-ip"].Applies {
		t.Errorf("with plan enterprise and no IP: %+v", got)
	}

	for _, bad := range []string{`{"nope": 1}`, `{"headers": "x"}`, `{"ip": "` + strings.Repeat("1", maxTenantBody) + `"}`} {
		if code, _ := admin(t, "POST", srv.admin+"/v1/admin/tenant", bad); code != http.StatusBadRequest {
			t.Errorf("%.40s: %d, want 400", bad, code)
		}
	}
	if code, _ := post(t, srv.admin+"/v1/admin/tenant", ask); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d, want 401", code)
	}
}
