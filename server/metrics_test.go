package server

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/driplimit/drip/store/memstore"
)

// scrape reads the admin listener's /metrics with Prometheus' own text
// parser: each series as name{label=value,...} (labels in name order)
// and its value (a histogram's: its count).
func scrape(t *testing.T, admin string) map[string]float64 {
	t.Helper()
	code, page := call(t, "GET", admin+"/metrics", "")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			out[name+"{"+strings.Join(ls, ",")+"}"] = m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return out
}

// TestMetricsAtZero: a fresh server has every series whose labels are
// known up front at 0, so that Prometheus' increase() sees the first
// failed reload, the first store error and each rule's first decision;
// a reload adds the new rules' series. Envoy's limits count as rules.
func TestMetricsAtZero(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "edge.yaml"), edgeLimits+`  - key: internal
    rate_limit: {unlimited: true}
`)
	path := filepath.Join(dir, "rules.json")
	writeFile(t, path, `{"rules": [
	  {"name": "api", "limit_keys": ["header:x-api-key"], "on_error": "deny", "algorithm_config": {"rps": 1}},
	  {"name": "watch", "limit_keys": ["global"], "mode": "shadow", "algorithm_config": {"rps": 1}}]}`)
	srv := start(t, Config{Rules: dir, WatchEvery: -1}, memstore.New())
	want := []string{
		"drip_rules_reloads_total{result=ok}", "drip_rules_reloads_total{result=error}",
		"drip_store_circuit_state{state=open}", "drip_store_circuit_state{state=half_open}",
		"drip_shadow_denials_total{rule=watch}",
	}
	for _, op := range []string{"take", "peek", "refund", "multi", "reset"} {
		want = append(want, "drip_store_errors_total{op="+op+"}", "drip_store_duration_seconds{op="+op+"}")
	}
	for _, o := range []string{"allowed", "denied", "not_taken", "error", "error_denied"} {
		want = append(want, "drip_decisions_total{mode=enforce,outcome="+o+",rule=api}")
	}
	for _, o := range []string{"allowed", "denied", "not_taken", "error", "error_allowed"} {
		want = append(want, "drip_decisions_total{mode=shadow,outcome="+o+",rule=watch}")
	}
	for _, o := range []string{"allowed", "denied", "not_taken", "refunded", "error"} {
		want = append(want, "drip_decisions_total{mode=enforce,outcome="+o+",rule=envoy:edge.remote_address}",
			"drip_decisions_total{mode=shadow,outcome="+o+",rule=envoy:login}")
	}
	want = append(want, "drip_decisions_total{mode=enforce,outcome=unlimited,rule=envoy:edge.internal}",
		"drip_shadow_denials_total{rule=envoy:login}")
	check := func(got map[string]float64, want []string) {
		t.Helper()
		for _, k := range want {
			if v, ok := got[k]; !ok || v != 0 {
				t.Errorf("%s: %v (present %v), want 0", k, v, ok)
			}
		}
	}
	check(scrape(t, srv.admin), want)

	writeFile(t, path, `{"rules": [{"name": "new", "limit_keys": ["global"], "on_error": "local", "algorithm_config": {"rps": 1}}]}`)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	got := scrape(t, srv.admin)
	var added []string
	for _, o := range []string{"allowed", "denied", "not_taken", "error", "local_allowed", "local_denied"} {
		added = append(added, "drip_decisions_total{mode=enforce,outcome="+o+",rule=new}")
	}
	check(got, append(added, "drip_local_fallback_decisions_total{rule=new}", "drip_rules_reloads_total{result=error}"))
	if v := got["drip_rules_reloads_total{result=ok}"]; v != 1 {
		t.Errorf("reloads ok: %v, want 1", v)
	}
}

// decisionSeries are the per-rule series of a scrape: decisions, shadow
// denials, local fallback decisions and settled tokens.
func decisionSeries(got map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range got {
		for _, name := range []string{"drip_decisions_total{", "drip_shadow_denials_total{", "drip_local_fallback_decisions_total{", "drip_settled_tokens_total{"} {
			if strings.HasPrefix(k, name) {
				out[k] = v
			}
		}
	}
	return out
}

// edgeLimits is an Envoy configuration of two limits, one in shadow mode.
const edgeLimits = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /login
    shadow_mode: true
    rate_limit: {name: login, unit: minute, requests_per_unit: 5}
`

// TestMetricsFollowReloads: after a reload, the per-rule series are
// those of the rules and Envoy limits in force, no more: the series of
// a rule or limit taken out (counted or not), and those of a rule's old
// mode, are gone; a rule that stays keeps its counts.
func TestMetricsFollowReloads(t *testing.T) {
	dir := t.TempDir()
	edge := filepath.Join(dir, "edge.yaml")
	writeFile(t, edge, edgeLimits)
	path := filepath.Join(dir, "rules.json")
	writeFile(t, path, `{"rules": [
	  {"name": "api", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rps": 1}},
	  {"name": "watch", "limit_keys": ["global"], "mode": "shadow", "algorithm_config": {"rps": 1}},
	  {"name": "keep", "limit_keys": ["global"], "algorithm_config": {"rps": 1}},
	  {"name": "gone", "limit_keys": ["global"], "on_error": "local", "algorithm_config": {"rps": 1}},
	  {"name": "billed", "limit_keys": ["global"], "cost_from_response": "header:x-cost", "algorithm_config": {"rps": 1}}]}`)
	srv := start(t, Config{Rules: dir, WatchEvery: -1, GRPCListen: "127.0.0.1:0"}, memstore.New())
	for _, body := range []string{`{"rule": "gone", "values": []}`, `{"rule": "keep", "values": []}`} {
		if code, out := post(t, srv.base+"/v1/take", body); code != 200 {
			t.Fatalf("take %s: %d %s", body, code, out)
		}
	}
	if code, out := call(t, "POST", srv.admin+"/json", `{"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "1.2.3.4"}]}]}`); code != 200 {
		t.Fatalf("/json: %d %s", code, out)
	}
	before := decisionSeries(scrape(t, srv.admin))
	for _, k := range []string{"drip_decisions_total{mode=enforce,outcome=allowed,rule=gone}", "drip_decisions_total{mode=enforce,outcome=allowed,rule=envoy:edge.remote_address}"} {
		if before[k] != 1 {
			t.Fatalf("%s: %v before the reload, want 1", k, before[k])
		}
	}

	// api turns shadow, gone and billed go, and the Envoy domain edge gives way
	// to core.
	writeFile(t, path, `{"rules": [
	  {"name": "api", "limit_keys": ["header:x-api-key"], "mode": "shadow", "algorithm_config": {"rps": 1}},
	  {"name": "watch", "limit_keys": ["global"], "mode": "shadow", "algorithm_config": {"rps": 1}},
	  {"name": "keep", "limit_keys": ["global"], "algorithm_config": {"rps": 1}}]}`)
	if err := os.Remove(edge); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "core.yaml"), `domain: core
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 5}
`)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"drip_shadow_denials_total{rule=api}": 0, "drip_shadow_denials_total{rule=watch}": 0}
	for _, o := range []string{"allowed", "denied", "not_taken", "error", "error_allowed"} {
		want["drip_decisions_total{mode=shadow,outcome="+o+",rule=api}"] = 0
		want["drip_decisions_total{mode=shadow,outcome="+o+",rule=watch}"] = 0
	}
	for _, o := range []string{"allowed", "denied", "not_taken", "error", "error_allowed"} {
		want["drip_decisions_total{mode=enforce,outcome="+o+",rule=keep}"] = 0
	}
	want["drip_decisions_total{mode=enforce,outcome=allowed,rule=keep}"] = 1
	for _, o := range []string{"allowed", "denied", "not_taken", "refunded", "error"} {
		want["drip_decisions_total{mode=enforce,outcome="+o+",rule=envoy:core.k}"] = 0
	}
	got := decisionSeries(scrape(t, srv.admin))
	for k, v := range got {
		if w, ok := want[k]; !ok || v != w {
			t.Errorf("after the reload: %s %v (expected %v, want %v)", k, v, ok, w)
		}
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			t.Errorf("after the reload: %s missing", k)
		}
	}
}
