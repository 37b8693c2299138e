package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/driplimit/drip/internal/testkit/testserver"
)

// TestGrafanaDashboard: every metric name in every query of
// deploy/grafana/drip.json, and every label name the queries use, exists
// in the /metrics of live drip serve processes: a decision API on the
// memory store and a gateway on a Redis server that is killed halfway, so
// that store errors, the local fallback and the circuit breaker have
// series. Label values (such as the outcomes) are not checked: the
// vocabulary may grow, and a query on a value that no longer exists shows
// an empty panel, not a broken one; denialRate checks the few the
// dashboard depends on. Every drip_ metric must also be on the
// dashboard.
func TestGrafanaDashboard(t *testing.T) {
	queries := dashboardQueries(t, filepath.Join("..", "..", "deploy", "grafana", "drip.json"))
	fams := liveMetrics(t)

	used := map[string]bool{}
	for _, q := range queries {
		metrics, labels, err := promqlRefs(q.expr)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		if len(metrics) == 0 {
			t.Errorf("%s: no metric in %q", q.where, q.expr)
		}
		have := map[string]bool{"instance": true, "job": true} // added by Prometheus when it scrapes
		for _, m := range metrics {
			f, extra, err := familyOf(fams, m)
			if err != nil {
				t.Errorf("%s: %v", q.where, err)
				continue
			}
			used[f.GetName()] = true
			for _, l := range extra {
				have[l] = true
			}
			for _, s := range f.GetMetric() {
				for _, lp := range s.GetLabel() {
					have[lp.GetName()] = true
				}
			}
		}
		for _, l := range append(labels, q.labels...) {
			if !have[l] {
				t.Errorf("%s: label %q is on none of %v", q.where, l, metrics)
			}
		}
	}
	denialRate(t, queries, fams)

	var missing []string
	for name := range fams {
		if strings.HasPrefix(name, "drip_") && !used[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("drip serve exposes metrics the dashboard does not show: %v", missing)
	}
}

// denialRate checks what can be checked without a Prometheus of the
// queries that read first events and rates: the Denial rate panel counts
// enforced rules only (every drip_decisions_total selector in it asks for
// mode="enforce", the label the shadow rule "watch" of liveMetrics does
// not carry), and shows 0 rather than no data for a rule that denied
// nothing or decided nothing (its denials "or" 0, over a clamped total);
// and the series that increase() reads for a failed reload exists at 0
// before any reload failed.
func denialRate(t *testing.T, queries []dashboardQuery, fams map[string]*dto.MetricFamily) {
	t.Helper()
	found := false
	for _, q := range queries {
		if !strings.HasPrefix(q.where, `panel "Denial rate"`) {
			continue
		}
		found = true
		sels := regexp.MustCompile(`drip_decisions_total\{([^}]*)\}`).FindAllStringSubmatch(q.expr, -1)
		if len(sels) == 0 {
			t.Errorf("%s: no drip_decisions_total selector in %q", q.where, q.expr)
		}
		for _, m := range sels {
			if !strings.Contains(m[1], `mode="enforce"`) {
				t.Errorf("%s: selector {%s} counts shadow rules: want mode=\"enforce\"", q.where, m[1])
			}
		}
		if !strings.Contains(q.expr, " or 0 * ") || !strings.Contains(q.expr, "clamp_min(") {
			t.Errorf("%s: %q shows no data for a rule that denied nothing or decided nothing: want its denials \"or 0 * \" its decisions, over clamp_min(total)", q.where, q.expr)
		}
	}
	if !found {
		t.Error(`no panel "Denial rate"`)
	}
	modes := map[string]map[string]bool{} // rule -> modes of its drip_decisions_total series
	for _, m := range fams["drip_decisions_total"].GetMetric() {
		var rule, mode string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "rule":
				rule = l.GetValue()
			case "mode":
				mode = l.GetValue()
			}
		}
		if modes[rule] == nil {
			modes[rule] = map[string]bool{}
		}
		modes[rule][mode] = true
	}
	if want := map[string]bool{"shadow": true}; !maps.Equal(modes["watch"], want) {
		t.Errorf("the shadow rule's decisions have modes %v, want %v", modes["watch"], want)
	}
	if want := map[string]bool{"enforce": true}; !maps.Equal(modes["api"], want) {
		t.Errorf("the enforced rule's decisions have modes %v, want %v", modes["api"], want)
	}
	reloadErrors := false
	for _, m := range fams["drip_rules_reloads_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "result" && l.GetValue() == "error" {
				reloadErrors = true
				if v := m.GetCounter().GetValue(); v != 0 {
					t.Errorf(`drip_rules_reloads_total{result="error"} %v, want 0: no reload failed`, v)
				}
			}
		}
	}
	if !reloadErrors {
		t.Error(`no drip_rules_reloads_total{result="error"} before a failed reload: increase() would miss the first`)
	}
}

type dashboardQuery struct {
	where  string   // the panel or variable, for messages
	expr   string   // PromQL
	labels []string // label names the query uses outside the expression
}

// dashboardQueries returns the PromQL of every panel target, template
// variable and annotation of a Grafana dashboard.
func dashboardQueries(t *testing.T, path string) []dashboardQuery {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Annotations struct {
			List []struct {
				Name string `json:"name"`
				Expr string `json:"expr"`
			} `json:"list"`
		} `json:"annotations"`
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []dashboardQuery
	var walk func([]panel)
	ids := map[int]bool{}
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d twice", p.ID)
			}
			ids[p.ID] = true
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				out = append(out, dashboardQuery{where: fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), expr: tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Fatalf("variable %s: query: %v", v.Name, err)
			}
		}
		// label_values(selector, label): Grafana's, not PromQL.
		inner, ok := strings.CutPrefix(q.Query, "label_values(")
		inner, ok2 := strings.CutSuffix(inner, ")")
		comma := strings.LastIndexByte(inner, ',')
		if !ok || !ok2 || comma < 0 {
			t.Fatalf("variable %s: want label_values(selector, label), got %q", v.Name, q.Query)
		}
		out = append(out, dashboardQuery{where: "variable " + v.Name, expr: inner[:comma], labels: []string{strings.TrimSpace(inner[comma+1:])}})
	}
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			out = append(out, dashboardQuery{where: "annotation " + a.Name, expr: a.Expr})
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no queries", path)
	}
	return out
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// familyOf finds the metric family a series name in a query belongs to:
// the family itself (a counter or gauge), or a classic histogram's or
// summary's _bucket, _sum or _count series. It also returns the labels
// such a series has beyond the family's (le, quantile). A bare histogram
// name selects nothing and is an error.
func familyOf(fams map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, []string, error) {
	if f, ok := fams[name]; ok {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			return nil, nil, fmt.Errorf("%s is a histogram: select %[1]s_bucket, %[1]s_sum or %[1]s_count", name)
		case dto.MetricType_SUMMARY:
			return f, []string{"quantile"}, nil
		}
		return f, nil, nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		f, ok := fams[base]
		if !ok {
			break
		}
		switch typ := f.GetType(); {
		case typ == dto.MetricType_HISTOGRAM || typ == dto.MetricType_GAUGE_HISTOGRAM:
			if suffix == "_bucket" {
				return f, []string{"le"}, nil
			}
			return f, nil, nil
		case typ == dto.MetricType_SUMMARY && suffix != "_bucket":
			return f, nil, nil
		}
		return nil, nil, fmt.Errorf("%s: %s is a %s, which has no %s series", name, base, f.GetType(), suffix)
	}
	return nil, nil, fmt.Errorf("metric %s is not in drip serve's /metrics", name)
}

// liveMetrics runs drip serve twice, drives requests through both, and
// returns the metric families of both /metrics pages together.
func liveMetrics(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	dir := t.TempDir()
	const token = "dashboard-test-token"

	// The decision API: an allowed and a denied take, a reload.
	apiRules := filepath.Join(dir, "api.json")
	writeTestFile(t, apiRules, `{"rules": [{"name": "api", "limit_keys": ["header:x-api-key"],
	  "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}},
	 {"name": "up", "limit_keys": ["global"], "algorithm": "adaptive", "max_wait": "20ms", "max_queue": 1,
	  "algorithm_config": {"initial_limit": 1, "min_limit": 1, "max_limit": 1}}]}`)
	api, apiAdmin, _ := serveInProcess(t, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--rules", apiRules, "--admin-token", token)
	for range 2 {
		if code, out := httpDo(t, "POST", "http://"+api+"/v1/take", `{"rule": "api", "values": ["k"]}`); code != 200 {
			t.Fatalf("take: %d %s", code, out)
		}
	}
	// The adaptive rule: its one slot held, a second acquire waits its
	// max_wait in the queue and is shed; then the slot is released.
	code, held := httpDo(t, "POST", "http://"+api+"/v1/acquire", `{"rule": "up", "values": []}`)
	lease := regexp.MustCompile(`"lease":"([^"]+)"`).FindStringSubmatch(held)
	if code != 200 || lease == nil {
		t.Fatalf("acquire: %d %s", code, held)
	}
	if code, out := httpDo(t, "POST", "http://"+api+"/v1/acquire", `{"rule": "up", "values": [], "wait": "20ms"}`); code != 200 || strings.Contains(out, `"allowed":true`) {
		t.Fatalf("a second acquire of one slot: %d %s, want denied after its wait", code, out)
	}
	if code, out := httpDo(t, "POST", "http://"+api+"/v1/release", `{"rule": "up", "values": [], "lease": "`+lease[1]+`"}`); code != 200 {
		t.Fatalf("release: %d %s", code, out)
	}
	req, _ := http.NewRequest("POST", "http://"+apiAdmin+"/v1/admin/reload", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("reload: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// The gateway on Redis: allowed, denied and a shadow denial; then the
	// store dies: errors, the local fallback, the breaker opens.
	redis := testserver.StartRedis(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(upstream.Close)
	gwRules := filepath.Join(dir, "gateway.yaml")
	writeTestFile(t, gwRules, `on_error: local
circuit_breaker: {failures: 2, cooldown: 1h}
rules:
  - name: api
    limit_keys: [header:x-api-key]
    algorithm_config: {rate: 1, period: 1h, burst: 3}
  - name: watch
    limit_keys: [header:x-api-key]
    mode: shadow
    algorithm_config: {rate: 1, period: 1h, burst: 1}
`)
	gw, gwAdmin, _ := serveInProcess(t, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--rules", gwRules, "--store", redis.URL(), "--upstream", upstream.URL, "--store-timeout", "2s")
	get := func() int {
		req, _ := http.NewRequest("GET", "http://"+gw+"/", nil)
		req.Header.Set("X-Api-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var codes []int
	for range 4 {
		codes = append(codes, get())
	}
	if !slices.Equal(codes, []int{200, 200, 200, 429}) {
		t.Fatalf("gateway answers %v, want 3 allowed then 429", codes)
	}
	redis.Kill()
	for range 4 {
		get()
	}

	fams := map[string]*dto.MetricFamily{}
	for _, admin := range []string{apiAdmin, gwAdmin} {
		code, page := httpDo(t, "GET", "http://"+admin+"/metrics", "")
		if code != 200 {
			t.Fatalf("/metrics: %d", code)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		got, err := p.TextToMetricFamilies(strings.NewReader(page))
		if err != nil {
			t.Fatalf("/metrics: %v", err)
		}
		for name, f := range got {
			if have, ok := fams[name]; ok {
				have.Metric = append(have.Metric, f.Metric...)
			} else {
				fams[name] = f
			}
		}
	}
	return fams
}

func writeTestFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
