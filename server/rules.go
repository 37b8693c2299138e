package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/server/envoy"
)

// ruleState is the rules in force, an immutable snapshot swapped whole on
// reload, and the bookkeeping of reloads.
type ruleState struct {
	cur atomic.Pointer[ruleSet]

	mu       sync.Mutex // serializes reloads
	hash     [32]byte   // of the file content last loaded or tried
	loadedAt time.Time
	envoy    *envoy.Config // envoyproxy/ratelimit files at the rules path (envoy.go)
}

// ruleSet is a rules set and its rules' limits compiled once, by rule:
// the plans of the decision API's requests by rule.
type ruleSet struct {
	set   *rules.Set
	plans map[*rules.Rule]*engine.Plan
}

func newRuleSet(set *rules.Set) *ruleSet {
	rs := &ruleSet{set: set, plans: make(map[*rules.Rule]*engine.Plan, len(set.Rules))}
	for i := range set.Rules {
		r := &set.Rules[i]
		rs.plans[r] = engine.PlanOf(r.Name, r.Limit)
	}
	return rs
}

// rules returns the rules in force.
func (s *Server) rules() *rules.Set { return s.rs.cur.Load().set }

// plan is the compiled plan of rule r's own limit; nil when r is no
// longer in force (the engine then compiles its limit for the request).
func (s *Server) plan(r *rules.Rule) *engine.Plan { return s.rs.cur.Load().plans[r] }

// loadRules loads the rules at start: a bad file is an error here (there
// are no older rules to keep).
func (s *Server) loadRules() (*ruleState, error) {
	rs := &ruleState{}
	var set *rules.Set
	if s.cfg.Rules == "" {
		set = rules.Default()
	} else {
		var err error
		set, rs.envoy, rs.hash, err = readRules(s.cfg.Rules, s.cfg.Envoy) // a file or a directory (envoy.go)
		if err == nil {
			err = s.checkHeld(set, rs.envoy)
		}
		if err != nil {
			return nil, err
		}
	}
	rs.cur.Store(newRuleSet(set))
	rs.loadedAt = time.Now()
	s.metrics.expect(set, rs.envoy) // their series at 0
	s.metrics.rulesOK.Set(1)
	s.metrics.rulesLoaded.Set(float64(len(set.Rules)))
	s.metrics.reloadTime.Set(float64(rs.loadedAt.UnixNano()) / 1e9)
	return rs, nil
}

// Reload reads the rules file again and, if it is valid, swaps it in as
// one snapshot: requests already deciding finish on the old rules, later
// ones see the new. If it is not valid the rules in force stay, and the
// error (every problem of the file) is logged, counted in
// drip_rules_reloads_total{result="error"} and returned. Buckets are
// keyed by rule name and key values, so a rule that keeps its name keeps
// its buckets. With the built-in rules there is nothing to reload.
func (s *Server) Reload() error {
	s.rs.mu.Lock()
	defer s.rs.mu.Unlock()
	if s.cfg.Rules == "" {
		return nil
	}
	set, env, hash, err := readRules(s.cfg.Rules, s.cfg.Envoy) // a file or a directory (envoy.go)
	if hash != ([32]byte{}) {
		s.rs.hash = hash
	}
	if err == nil {
		err = s.checkHeld(set, env)
	}
	if err != nil {
		s.metrics.reloads.WithLabelValues("error").Inc()
		s.metrics.rulesOK.Set(0)
		s.log.Error("drip serve: rules reload failed; the rules in force stay", "file", s.cfg.Rules, "err", err.Error())
		return err
	}
	s.rs.cur.Store(newRuleSet(set))
	s.swapLimiter(set)
	s.checkStale(s.eng.Overrides(), true, nil) // stale.go: overrides of a rule whose algorithm changed
	s.rs.envoy = env
	if s.rls != nil {
		s.rls.Swap(env)
	}
	s.rs.loadedAt = time.Now()
	s.metrics.expect(set, env)
	s.metrics.reloads.WithLabelValues("ok").Inc()
	s.metrics.rulesOK.Set(1)
	s.metrics.rulesLoaded.Set(float64(len(set.Rules)))
	s.metrics.reloadTime.Set(float64(s.rs.loadedAt.UnixNano()) / 1e9)
	s.log.Info("drip serve: rules reloaded", "file", s.cfg.Rules, "rules", len(set.Rules))
	return nil
}

func (s *Server) lastHash() [32]byte {
	s.rs.mu.Lock()
	defer s.rs.mu.Unlock()
	return s.rs.hash
}

// ruleRequest builds the request of rule name for key values given as a
// JSON list (one per limit key but "global", in order) or object (limit
// key to value). Its cost is the rule's fixed_cost, or default_cost when
// the rule reads costs from requests. mode is the rule's.
func (s *Server) ruleRequest(name string, values json.RawMessage) (drip.Request, target, error) {
	r, err := s.rule(name)
	if err != nil {
		return drip.Request{}, target{}, err
	}
	if r.Adaptive != nil {
		// Its slots are counted in each instance, not in the store: a
		// single request acquires one (slots.go), never a multi-take.
		return drip.Request{}, target{}, inputf("rule %q is adaptive: its slots are held in each instance, one request at a time (a single /v1/acquire), not in a multi-take", name)
	}
	key, err := ruleKey(r, values, s.rules())
	if err != nil {
		return drip.Request{}, target{}, err
	}
	t := target{name: r.Name, mode: r.Mode}
	l, over := s.eng.LimitOf(r, key, nil) // the key's override, if any
	if !over {
		t.plan = s.plan(r)
	}
	return drip.Request{Key: key, Limit: l, Cost: ruleCost(r)}, t, nil
}

// ruleCost is the cost of a request by rule r that names none: its
// fixed_cost, or its default_cost when it reads costs from requests.
func ruleCost(r *rules.Rule) float64 {
	if r.CostSource.Kind == rules.KindFixed || r.CostSource.Kind == "" {
		return r.FixedCost
	}
	return r.DefaultCost
}

// rule returns the rule in force called name, or a 404.
func (s *Server) rule(name string) (*rules.Rule, error) {
	r, ok := s.rules().Rule(name)
	if !ok {
		return nil, errorf(http.StatusNotFound, "unknown rule %q", name)
	}
	return r, nil
}

// ruleKey builds the bucket key of r from values as the decision API
// takes them, each keyed as the middleware keys it under set (keyValue).
func ruleKey(r *rules.Rule, values json.RawMessage, set *rules.Set) (string, error) {
	srcs := r.KeySources()
	want := func() string {
		names := make([]string, len(srcs))
		for i, s := range srcs {
			names[i] = s.String()
		}
		return "[" + strings.Join(names, ", ") + "]"
	}
	v := bytes.TrimSpace(values)
	switch {
	case len(v) == 0 || string(v) == "null":
		if len(srcs) > 0 {
			return "", inputf("rule %q needs values for %s", r.Name, want())
		}
		return r.Key(nil), nil
	case v[0] == '[':
		var list []string
		if err := json.Unmarshal(v, &list); err != nil {
			return "", inputf("values: want a list of strings: %v", err)
		}
		if len(list) != len(srcs) {
			return "", inputf("rule %q needs %d values, for %s; got %d", r.Name, len(srcs), want(), len(list))
		}
		for i, x := range list {
			if x == "" {
				return "", inputf("values[%d] (%s) is empty", i, srcs[i])
			}
		}
		for i, src := range srcs {
			list[i] = keyValue(src, list[i], set)
			if src.Hashed {
				list[i] = r.HashValue(list[i])
			}
		}
		return r.Key(list), nil
	case v[0] == '{':
		var m map[string]string
		if err := json.Unmarshal(v, &m); err != nil {
			return "", inputf("values: want an object of strings: %v", err)
		}
		for k, x := range m {
			if src, err := rules.ParseSource(k); err == nil {
				m[k] = keyValue(src, x, set)
			}
		}
		key, err := r.KeyFrom(m)
		if err != nil {
			return "", inputf("values: %v", err)
		}
		return key, nil
	}
	return "", inputf("values: want a list of strings, one for each of %s, or an object from limit key to value", want())
}

// keyValue is the value x of the limit key src as the middleware keys
// it: a client address by its prefix of the rules' ipv6_prefix (so that
// "2001:db8::1" and "2001:db8::2" share the bucket of 2001:db8::/64), a
// method in upper case, a path folded unless exact_paths (the caller
// gives the path as rules read it: decoded, without parameters or dot
// segments).
func keyValue(src rules.Source, x string, set *rules.Set) string {
	switch {
	case src.Kind == rules.KindIP:
		return keyIP(x, set.IPv6Prefix)
	case src.Kind == rules.KindMethod:
		return rules.CleanMethod(x)
	case src.Kind == rules.KindPath && !set.ExactPaths:
		return rules.FoldPath(x)
	}
	return x
}

// RuleOf names what the bucket key key belongs to, for metrics of a
// bounded number of series: the rule in force whose key it is (a rule's
// keys begin with its name, then '|' or nothing), "envoy" for the keys of
// Envoy's limits, else "" (a decision API request's own limit, or a key
// too long to be kept whole).
func (s *Server) RuleOf(key string) string {
	if strings.HasPrefix(key, "envoy:") {
		return "envoy"
	}
	name, _, _ := strings.Cut(key, "|")
	if _, ok := s.rules().Rule(name); ok {
		return name
	}
	return ""
}

// ruleView is a rule as the admin API shows it.
type ruleView struct {
	Name      string     `json:"name"`
	Group     string     `json:"group,omitempty"`
	LimitKeys []string   `json:"limit_keys"`
	Mode      string     `json:"mode"`
	Limit     drip.Limit `json:"limit"`
	OnError   string     `json:"on_error"`
	// Leased reports a leased rule ("leased": true).
	Leased bool `json:"leased,omitempty"`
	// Claims is the rule's limit_from_claims, if any.
	Claims *rules.ClaimLimit `json:"limit_from_claims,omitempty"`
	// MaxWait and MaxQueue are the rule's max_wait ("300ms") and
	// max_queue, when it sets max_wait.
	MaxWait  string `json:"max_wait,omitempty"`
	MaxQueue int    `json:"max_queue,omitempty"`
	// Adaptive is, for an adaptive rule, its algorithm_config and what
	// it has learned in this instance.
	Adaptive *adaptiveView `json:"adaptive,omitempty"`
	// Priority is the class of the rule's requests that name none,
	// PriorityFrom where they name it, Reserve the share kept for
	// critical ones: for a rule with priorities.
	Priority     string  `json:"priority,omitempty"`
	PriorityFrom string  `json:"priority_from,omitempty"`
	Reserve      float64 `json:"reserve,omitempty"`
}

// adaptiveView is an adaptive rule's configuration and learned state.
type adaptiveView struct {
	InitialLimit int     `json:"initial_limit"`
	MinLimit     int     `json:"min_limit"`
	MaxLimit     int     `json:"max_limit"`
	Tolerance    float64 `json:"tolerance"`
	Smoothing    float64 `json:"smoothing"`
	Window       string  `json:"window"`
	// Limit is the learned limit (added up over the rule's keys, which
	// Buckets counts), InFlight and Queued the requests holding and
	// waiting for a slot, Baseline the latency learned of the upstream
	// unloaded (the longest of the keys'), all in this instance.
	Limit    float64 `json:"limit"`
	InFlight int     `json:"in_flight"`
	Queued   int     `json:"queued"`
	Buckets  int     `json:"buckets"`
	Baseline string  `json:"baseline"`
}

func (s *Server) adminRules(w http.ResponseWriter, r *http.Request) {
	set := s.rules()
	s.rs.mu.Lock()
	loaded := s.rs.loadedAt
	s.rs.mu.Unlock()
	file := s.cfg.Rules
	if file == "" {
		file = "(built-in default)"
	}
	out := struct {
		File     string     `json:"file"`
		LoadedAt time.Time  `json:"loaded_at"`
		Rules    []ruleView `json:"rules"`
	}{File: file, LoadedAt: loaded, Rules: []ruleView{}}
	learned := s.eng.Adaptive()
	for _, ru := range set.Rules {
		v := ruleView{Name: ru.Name, Group: ru.Group, Mode: string(ru.Mode), Limit: ru.Limit, OnError: string(ru.OnError), Leased: ru.Limit.Leased, LimitKeys: []string{}, Claims: ru.Claims}
		for _, k := range ru.LimitKeys {
			v.LimitKeys = append(v.LimitKeys, k.String())
		}
		if ru.MaxWait > 0 {
			v.MaxWait, v.MaxQueue = ru.MaxWait.String(), ru.MaxQueue
		}
		if a := ru.Adaptive; a != nil {
			v.Adaptive = &adaptiveView{InitialLimit: a.InitialLimit, MinLimit: a.MinLimit, MaxLimit: a.MaxLimit,
				Tolerance: a.Tolerance, Smoothing: a.Smoothing, Window: a.Window.String(), Limit: float64(a.InitialLimit), Baseline: "0s"}
			for _, st := range learned {
				if st.Rule == ru.Name {
					v.Adaptive.Limit, v.Adaptive.InFlight, v.Adaptive.Queued, v.Adaptive.Buckets = st.Limit, st.InFlight, st.Queued, st.Buckets
					v.Adaptive.Baseline = st.Baseline.String()
				}
			}
		}
		if ru.Prioritized() {
			v.Priority, v.Reserve = rules.PriorityName(ru.Class()), ru.Reserve
			if ru.PriorityFrom != nil {
				v.PriorityFrom = ru.PriorityFrom.String()
			}
		}
		out.Rules = append(out.Rules, v)
	}
	writeJSON(w, http.StatusOK, out)
}

// keyIP normalizes an IP address value as httplimit keys client IPs; a
// value that is not an address (say, a prefix already) is kept as is.
func keyIP(v string, v6bits int) string {
	a, err := netip.ParseAddr(v)
	if err != nil {
		return v
	}
	return httplimit.KeyIP(a.WithZone("").Unmap(), v6bits)
}
