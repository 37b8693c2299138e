package promobserver_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/httplimit/promobserver"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// TestCounts drives the middleware through three requests of one client
// on an enforce rule of burst 2 beside a shadow rule of burst 1, and reads
// the series.
func TestCounts(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
		{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 2}},
		{"name": "watch", "limit_keys": ["global"], "mode": "shadow", "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New()
	defer store.Close()
	obs := promobserver.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	lim := httplimit.New(store, set, engine.WithObserver(obs))
	defer lim.Close()
	h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var codes []int
	for range 3 {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Api-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codes = append(codes, w.Code)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("statuses %v, want 200 200 429", codes)
	}
	// The shadow rule is taken only when the request is allowed (twice):
	// it allows the first and would deny the second; on the denied third
	// it is peeked, and would deny again.
	w := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	got := w.Body.String()
	for _, want := range []string{
		`drip_decisions_total{mode="enforce",outcome="allowed",rule="per-key"} 2` + "\n",
		`drip_decisions_total{mode="enforce",outcome="denied",rule="per-key"} 1` + "\n",
		`drip_decisions_total{mode="shadow",outcome="allowed",rule="watch"} 1` + "\n",
		`drip_decisions_total{mode="shadow",outcome="denied",rule="watch"} 2` + "\n",
		`drip_shadow_denials_total{rule="watch"} 2` + "\n",
		`drip_store_circuit_state{state="closed"} 1` + "\n",
		`drip_store_circuit_state{state="open"} 0` + "\n",
		"drip_store_errors_total 0\n",
		"drip_store_duration_seconds_count ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("metrics lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "drip_local_fallback_decisions_total{") {
		t.Errorf("a fallback counted with the store up:\n%s", got)
	}
}

// down is a store that fails every call.
type down struct{ store.Store }

func (down) Apply(context.Context, bucket.Op, time.Time, []bucket.Prepared, []bucket.Result) error {
	return errors.New("connection refused")
}

func (down) Caps() store.Caps { return store.Caps{} }

// TestStoreDown: failed store calls are counted, and on_error: local
// decisions count as fallback decisions.
func TestStoreDown(t *testing.T) {
	set, err := rules.Parse([]byte(`{"on_error": "local", "rules": [
		{"name": "all", "limit_keys": ["global"], "algorithm_config": {"rps": 10}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	obs := promobserver.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	lim := httplimit.New(down{}, set, engine.WithObserver(obs))
	defer lim.Close()
	w := httptest.NewRecorder()
	lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != 200 {
		t.Fatalf("status %d, want 200 from the local fallback", w.Code)
	}
	m := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(m, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{
		`drip_decisions_total{mode="enforce",outcome="local_allowed",rule="all"} 1` + "\n",
		`drip_local_fallback_decisions_total{rule="all"} 1` + "\n",
		"drip_store_errors_total 1\n",
	} {
		if !strings.Contains(m.Body.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, m.Body.String())
		}
	}
}

// TestExpect: Expect creates at zero the series each rule can count,
// labelled with its mode, so that the first event shows in increase();
// the breaker's and the store's exist from New.
func TestExpect(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
		{"name": "a", "limit_keys": ["global"], "algorithm_config": {"rps": 1}},
		{"name": "d", "limit_keys": ["global"], "on_error": "deny", "algorithm_config": {"rps": 1}},
		{"name": "l", "limit_keys": ["global"], "on_error": "local", "algorithm_config": {"rps": 1}},
		{"name": "s", "limit_keys": ["global"], "mode": "shadow", "on_error": "local", "algorithm_config": {"rps": 1}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	obs := promobserver.New()
	obs.Expect(set.Rules...)
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{} // name{label=value,...} in label name order
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
			got[f.GetName()+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	want := map[string]float64{
		"drip_store_circuit_state{state=closed}":      1,
		"drip_store_circuit_state{state=open}":        0,
		"drip_store_circuit_state{state=half_open}":   0,
		"drip_store_errors_total{}":                   0,
		"drip_store_duration_seconds{}":               0,
		"drip_shadow_denials_total{rule=s}":           0,
		"drip_local_fallback_decisions_total{rule=l}": 0,
	}
	outcomes := map[string][]string{
		"a": {"allowed", "denied", "not_taken", "error", "error_allowed"},
		"d": {"allowed", "denied", "not_taken", "error", "error_denied"},
		"l": {"allowed", "denied", "not_taken", "error", "local_allowed", "local_denied"},
		"s": {"allowed", "denied", "not_taken", "error", "error_allowed"},
	}
	for rule, outs := range outcomes {
		mode := "enforce"
		if rule == "s" {
			mode = "shadow"
		}
		for _, o := range outs {
			want["drip_decisions_total{mode="+mode+",outcome="+o+",rule="+rule+"}"] = 0
		}
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s: %v (present %v), want %v", k, g, ok, v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected series %s", k)
		}
	}
}

// TestForget: Forget and ForgetMode of each mode delete every series of
// a rule, counted or not (decisions of each event and mode, shadow
// denials, local fallback, settled tokens); ForgetMode alone the
// decisions of one mode; the series of other rules stay as they were.
func TestForget(t *testing.T) {
	obs := promobserver.New(promobserver.WithoutStore())
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	series := func() map[string]bool {
		t.Helper()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{} // name/rule, and name/rule/mode
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				var rule, mode string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "rule":
						rule = l.GetValue()
					case "mode":
						mode = "/" + l.GetValue()
					}
				}
				out[f.GetName()+"/"+rule], out[f.GetName()+"/"+rule+mode] = true, true
			}
		}
		return out
	}
	for _, rule := range []string{"gone", "kept", "moved"} {
		obs.ExpectEvents(rule, rules.Shadow, engine.Allowed)
		for _, mode := range []rules.Mode{rules.Enforce, rules.Shadow} {
			for _, e := range []engine.Event{engine.Allowed, engine.Denied, engine.LocalDenied, engine.Unlimited, engine.Settled, engine.Charged} {
				obs.Decision(rule, mode, e)
			}
		}
		obs.Tokens(rule, engine.Charged, 2)
		obs.Tokens(rule, engine.Forgiven, 1)
	}
	obs.Forget("gone", rules.Enforce)
	obs.ForgetMode("gone", rules.Shadow)
	obs.ForgetMode("moved", rules.Shadow)
	got := series()
	for _, name := range []string{"drip_decisions_total", "drip_shadow_denials_total", "drip_local_fallback_decisions_total", "drip_settled_tokens_total"} {
		if got[name+"/gone"] {
			t.Errorf("%s of the forgotten rule is there", name)
		}
		if !got[name+"/kept"] {
			t.Errorf("%s of the kept rule is gone", name)
		}
	}
	if got["drip_shadow_denials_total/moved"] {
		t.Error("the shadow denials of a rule no longer in shadow mode are there")
	}
	for _, name := range []string{"drip_decisions_total", "drip_local_fallback_decisions_total", "drip_settled_tokens_total"} {
		if !got[name+"/moved"] {
			t.Errorf("%s of the rule that changed mode is gone", name)
		}
	}
	// Of the rule that changed mode, only its enforce decisions stay.
	if got["drip_decisions_total/moved/shadow"] || !got["drip_decisions_total/moved/enforce"] {
		t.Errorf("the decisions of the rule that changed mode: shadow %v, enforce %v; want only enforce",
			got["drip_decisions_total/moved/shadow"], got["drip_decisions_total/moved/enforce"])
	}
}
