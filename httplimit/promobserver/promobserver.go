// Package promobserver counts what drip's engine does as Prometheus
// metrics, for programs that run a front door themselves: the httplimit
// middleware, or the Envoy service (drip serve has its own, with the same
// names):
//
//	obs := promobserver.New()
//	prometheus.MustRegister(obs) // or your own registry
//	obs.Expect(set.Rules...)     // their series at 0 (again after a reload)
//	lim := httplimit.New(store, set, engine.WithObserver(obs))
//
// The series:
//
//	drip_decisions_total{rule, mode, outcome}   one per rule that applied to a request;
//	                                            mode is the rule's (enforce, shadow),
//	                                            outcome is an engine.Event
//	drip_shadow_denials_total{rule}             requests a shadow rule would have denied
//	drip_local_fallback_decisions_total{rule}   decisions of the local fallback (on_error: local)
//	drip_settled_tokens_total{rule, outcome}    tokens moved after responses (cost_from_response,
//	                                            count_status, Envoy's charges): outcome charged,
//	                                            refunded, or forgiven (past the debt bound)
//	drip_spent_tokens_total{rule}               what cost_from_response rules' requests cost in
//	                                            the end: a token budget's spend
//	drip_spent_micro_units_total{rule}          the same for a rule that counts a call's price
//	                                            (openai:money): a money budget's spend
//	drip_shed_total{rule, class}                requests a rule with priorities denied, by
//	                                            their class (critical, default, sheddable,
//	                                            batch; a number is counted in its band,
//	                                            rules.PriorityBand)
//	drip_adaptive_limit{rule}                   an adaptive rule's learned limit (added up
//	                                            over its keys), with WatchAdaptive; and
//	drip_adaptive_in_flight{rule}               its requests holding a slot,
//	drip_adaptive_queue_length{rule}            waiting for one,
//	drip_adaptive_baseline_seconds{rule}        and the latency it learned of the upstream
//	                                            unloaded (the longest of its keys')
//	drip_store_duration_seconds                 latency of the store calls made
//	drip_store_errors_total                     store calls that failed or timed out
//	drip_store_circuit_state{state}             1 for the breaker's state, 0 for the others
//
// A series is created by its first event, unless Expect created it
// before: Prometheus then has no sample of it before the event, so
// increase() and rate() miss that first event. Expect the rules in force
// (New creates the breaker's and the store's series at once), and Forget
// those a reload took out: a series stays until it is forgotten.
package promobserver

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/llm"
	"github.com/driplimit/drip/rules"
)

// Observer is an engine.Observer (so an engine.Observer) and a
// prometheus.Collector. It is safe
// for concurrent use. Construct it with New and register it once.
type Observer struct {
	decisions     *prometheus.CounterVec
	shadowDenials *prometheus.CounterVec
	fallback      *prometheus.CounterVec
	settled       *prometheus.CounterVec
	spent         *prometheus.CounterVec
	spentMoney    *prometheus.CounterVec
	money         sync.Map // names of the rules whose spend is money
	storeSeconds  prometheus.Histogram
	storeErrors   prometheus.Counter
	circuit       *prometheus.GaugeVec
	queued        *prometheus.GaugeVec
	waits         *prometheus.HistogramVec
	shed          *prometheus.CounterVec
	store         bool // the store series are collected

	adaptiveMu sync.Mutex
	adaptive   func() []engine.AdaptiveState // WatchAdaptive
}

var (
	descAdaptiveLimit    = prometheus.NewDesc("drip_adaptive_limit", "The in-flight limit an adaptive rule learned in this instance (added up over its keys).", []string{"rule"}, nil)
	descAdaptiveInFlight = prometheus.NewDesc("drip_adaptive_in_flight", "Requests holding a slot of an adaptive rule in this instance.", []string{"rule"}, nil)
	descAdaptiveQueue    = prometheus.NewDesc("drip_adaptive_queue_length", "Requests waiting for a slot of an adaptive rule (max_wait) in this instance.", []string{"rule"}, nil)
	descAdaptiveBaseline = prometheus.NewDesc("drip_adaptive_baseline_seconds", "The latency an adaptive rule learned of its upstream unloaded (the longest of its keys').", []string{"rule"}, nil)
)

// WatchAdaptive makes the observer report, at each scrape, what the
// adaptive rules have learned (engine.Engine.Adaptive): the series of a
// rule exist while the engine learns for it, and go with it on reload.
func (o *Observer) WatchAdaptive(f func() []engine.AdaptiveState) {
	o.adaptiveMu.Lock()
	defer o.adaptiveMu.Unlock()
	o.adaptive = f
}

// Shed implements engine.AdaptiveObserver.
func (o *Observer) Shed(rule string, class int) {
	o.shed.WithLabelValues(rule, rules.PriorityName(rules.PriorityBand(class))).Inc()
}

func (o *Observer) collectAdaptive(ch chan<- prometheus.Metric) {
	o.adaptiveMu.Lock()
	f := o.adaptive
	o.adaptiveMu.Unlock()
	if f == nil {
		return
	}
	for _, st := range f() {
		ch <- prometheus.MustNewConstMetric(descAdaptiveLimit, prometheus.GaugeValue, st.Limit, st.Rule)
		ch <- prometheus.MustNewConstMetric(descAdaptiveInFlight, prometheus.GaugeValue, float64(st.InFlight), st.Rule)
		ch <- prometheus.MustNewConstMetric(descAdaptiveQueue, prometheus.GaugeValue, float64(st.Queued), st.Rule)
		ch <- prometheus.MustNewConstMetric(descAdaptiveBaseline, prometheus.GaugeValue, st.Baseline.Seconds(), st.Rule)
	}
}

// Option configures an Observer.
type Option func(*Observer)

// WithoutStore leaves out drip_store_duration_seconds and
// drip_store_errors_total, for a program that counts its store calls
// itself (drip serve counts them by operation, at the store).
func WithoutStore() Option { return func(o *Observer) { o.store = false } }

var (
	_ engine.Observer         = (*Observer)(nil)
	_ engine.QueueObserver    = (*Observer)(nil)
	_ engine.AdaptiveObserver = (*Observer)(nil)
	_ engine.Observer         = prefixed{}
	_ prometheus.Collector    = (*Observer)(nil)
)

// New returns an Observer with its series at zero and the breaker closed.
func New(opts ...Option) *Observer {
	o := &Observer{
		store: true,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drip_decisions_total",
			Help: "Decisions by rule, its mode (enforce, shadow: its denials let the request through) and outcome: allowed, denied, not_taken, error_allowed, error_denied, local_allowed, local_denied, error (the store failed and the caller got an error), refunded, unlimited; after a response (cost_from_response, count_status): charged, forgiven, settled (nothing to change), unreported (the response said nothing of its cost: the estimate stands).",
		}, []string{"rule", "mode", "outcome"}),
		shadowDenials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drip_shadow_denials_total",
			Help: "Requests a shadow-mode rule would have denied (and let through).",
		}, []string{"rule"}),
		fallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drip_local_fallback_decisions_total",
			Help: "Decisions made by the per-instance local limiter while the store was failing (on_error: local), by rule.",
		}, []string{"rule"}),
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drip_settled_tokens_total",
			Help: "Tokens moved when responses ended (cost_from_response, count_status, Envoy's charges: drip_settle descriptors and settle limits), by rule and outcome: charged (into debt if need be), refunded, forgiven (past the debt bound, not charged).",
		}, []string{"rule", "outcome"}),
		spent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drip_spent_tokens_total",
			Help: "What the requests of a cost_from_response rule cost in the end, as its bucket counts them (the estimate taken, less refunds, plus charges), by rule: a token budget's spend.",
		}, []string{"rule"}),
		spentMoney: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drip_spent_micro_units_total",
			Help: "What the requests of a rule that counts a call's price (cost_from_response: openai:money or anthropic:money) cost in the end, in micro-units of the price table's currency, by rule: a money budget's spend.",
		}, []string{"rule"}),
		storeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "drip_store_duration_seconds",
			Help:    "Latency of the engine's store calls.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drip_store_errors_total",
			Help: "The engine's store calls that failed or timed out.",
		}),
		circuit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "drip_store_circuit_state",
			Help: "The state of the engine's circuit breaker in front of the store: 1 for the current state (closed, open, half_open), 0 for the others.",
		}, []string{"state"}),
		queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "drip_queue_length",
			Help: "Requests waiting for their turn under a rule (max_wait, the decision API's wait), by rule, in this instance.",
		}, []string{"rule"}),
		waits: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "drip_queue_wait_seconds",
			Help:    "How long requests waited for their turn under a rule (max_wait, the decision API's wait), by rule and result: allowed (their turn came) or denied (the wait ran out, or the client left).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"rule", "result"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drip_shed_total",
			Help: "Requests a rule with classes of priority denied (an adaptive rule at its limit, or a rule keeping its reserve for higher classes), by rule and the request's class: critical (100), default (50 to 99), sheddable (25 to 49) or batch (0 to 24).",
		}, []string{"rule", "class"}),
	}
	for _, f := range opts {
		f(o)
	}
	o.BreakerState(engine.BreakerClosed)
	return o
}

// Describe implements prometheus.Collector.
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range o.collectors() {
		c.Describe(ch)
	}
	ch <- descAdaptiveLimit
	ch <- descAdaptiveInFlight
	ch <- descAdaptiveQueue
	ch <- descAdaptiveBaseline
}

// Collect implements prometheus.Collector.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	for _, c := range o.collectors() {
		c.Collect(ch)
	}
	o.collectAdaptive(ch)
}

func (o *Observer) collectors() []prometheus.Collector {
	if !o.store {
		return []prometheus.Collector{o.decisions, o.shadowDenials, o.fallback, o.settled, o.spent, o.spentMoney, o.circuit, o.queued, o.waits, o.shed}
	}
	return []prometheus.Collector{o.decisions, o.shadowDenials, o.fallback, o.settled, o.spent, o.spentMoney, o.storeSeconds, o.storeErrors, o.circuit, o.queued, o.waits, o.shed}
}

// Prefixed returns an observer of the same series that puts prefix before
// every rule name: drip serve names the Envoy service's limits
// "envoy:<limit>" beside its rules.
func (o *Observer) Prefixed(prefix string) engine.Observer { return prefixed{o, prefix} }

type prefixed struct {
	*Observer
	prefix string
}

func (p prefixed) Decision(rule string, mode rules.Mode, outcome engine.Event) {
	p.Observer.Decision(p.prefix+rule, mode, outcome)
}

func (p prefixed) Tokens(rule string, outcome engine.Event, tokens float64) {
	p.Observer.Tokens(p.prefix+rule, outcome, tokens)
}

// Expect creates at zero the series that each of rs can count: its
// decisions allowed, denied, not_taken and error, and those its on_error
// gives (a shadow rule's: error_allowed), its shadow denials (a shadow
// rule), its local fallback's decisions (on_error local) and, for a rule
// settled after the response (cost_from_response, count_status), its
// settlements: charged, refunded, forgiven and settled. Call it with
// the rules in force, and after each reload with the new ones; the
// series of a rule that is gone stay, as they would had they counted.
func (o *Observer) Expect(rs ...rules.Rule) {
	for _, r := range rs {
		events := []engine.Event{engine.Allowed, engine.Denied, engine.NotTaken, engine.Failed}
		switch {
		case r.Mode == rules.Shadow || r.OnError == rules.Allow:
			events = append(events, engine.ErrorAllowed)
		case r.OnError == rules.Deny:
			events = append(events, engine.ErrorDenied)
		case r.OnError == rules.Local:
			events = append(events, engine.LocalAllowed, engine.LocalDenied)
		}
		if r.Settles() { // cost_from_response, count_status: Outcome.Settle's events
			events = append(events, engine.Charged, engine.Refunded, engine.Forgiven, engine.Settled, engine.Unreported)
			for _, e := range settleEvents {
				o.settled.WithLabelValues(r.Name, string(e))
			}
			switch {
			case r.CostFrom != nil && isMoney(r.CostFrom.API):
				o.money.Store(r.Name, true)
				o.spentMoney.WithLabelValues(r.Name)
			case r.CostFrom != nil:
				o.money.Delete(r.Name)
				o.spent.WithLabelValues(r.Name)
			}
		}
		o.ExpectEvents(r.Name, r.Mode, events...)
		if r.MaxWait > 0 {
			o.queued.WithLabelValues(r.Name)
			o.waits.WithLabelValues(r.Name, "allowed")
			o.waits.WithLabelValues(r.Name, "denied")
		}
		if r.Prioritized() || r.Adaptive != nil {
			for _, c := range []int{rules.PriorityCritical, rules.PriorityDefault, rules.PrioritySheddable, rules.PriorityBatch} {
				o.shed.WithLabelValues(r.Name, rules.PriorityName(c))
			}
		}
	}
}

// ExpectEvents creates at zero the series of rule (a rule's name, or
// anything its front door counts decisions under, such as an Envoy limit)
// in mode for events: its decisions, its shadow denials in shadow mode,
// its local fallback's decisions with a local event. Expect calls it for
// rules.
func (o *Observer) ExpectEvents(rule string, mode rules.Mode, events ...engine.Event) {
	for _, e := range events {
		o.decisions.WithLabelValues(rule, string(mode), string(e))
		if e == engine.LocalAllowed || e == engine.LocalDenied {
			o.fallback.WithLabelValues(rule)
		}
	}
	if mode == rules.Shadow {
		o.shadowDenials.WithLabelValues(rule)
	}
}

// events are every engine.Event a decision series can carry: what Forget
// deletes.
var events = []engine.Event{engine.Allowed, engine.Denied, engine.NotTaken,
	engine.ErrorAllowed, engine.ErrorDenied, engine.LocalAllowed, engine.LocalDenied,
	engine.Failed, engine.Refunded, engine.Unlimited,
	engine.Charged, engine.Forgiven, engine.Settled, engine.Unreported}

// settleEvents are the outcomes of drip_settled_tokens_total.
var settleEvents = []engine.Event{engine.Charged, engine.Refunded, engine.Forgiven}

// Forget deletes the series of rule in mode (its decisions, its shadow
// denials in shadow mode) and those of rule in any mode (its local
// fallback's decisions, its settled tokens): call it for each rule (or
// Envoy limit) a reload took out of force, with the mode it had, so
// that the series of rules that come and go do not pile up. Each call
// costs a few dozen map deletions, whatever the number of series.
func (o *Observer) Forget(rule string, mode rules.Mode) {
	o.ForgetMode(rule, mode)
	o.fallback.DeleteLabelValues(rule)
	for _, e := range settleEvents {
		o.settled.DeleteLabelValues(rule, string(e))
	}
	o.queued.DeleteLabelValues(rule)
	o.spent.DeleteLabelValues(rule)
	o.spentMoney.DeleteLabelValues(rule)
	o.money.Delete(rule)
	o.waits.DeletePartialMatch(prometheus.Labels{"rule": rule})
	o.shed.DeletePartialMatch(prometheus.Labels{"rule": rule})
}

// ForgetMode deletes the decisions of rule in mode (and its shadow
// denials, for Shadow): for a rule that stays under another mode.
func (o *Observer) ForgetMode(rule string, mode rules.Mode) {
	for _, e := range events {
		o.decisions.DeleteLabelValues(rule, string(mode), string(e))
	}
	if mode == rules.Shadow {
		o.shadowDenials.DeleteLabelValues(rule)
	}
}

// Decision implements engine.Observer.
func (o *Observer) Decision(rule string, mode rules.Mode, outcome engine.Event) {
	o.decisions.WithLabelValues(rule, string(mode), string(outcome)).Inc()
	local := outcome == engine.LocalAllowed || outcome == engine.LocalDenied
	if local {
		o.fallback.WithLabelValues(rule).Inc()
	}
	if mode == rules.Shadow && (outcome == engine.Denied || outcome == engine.LocalDenied) {
		o.shadowDenials.WithLabelValues(rule).Inc()
	}
}

// Tokens implements engine.Observer.
func (o *Observer) Tokens(rule string, outcome engine.Event, tokens float64) {
	if outcome == engine.Spent {
		if _, ok := o.money.Load(rule); ok {
			o.spentMoney.WithLabelValues(rule).Add(tokens)
			return
		}
		o.spent.WithLabelValues(rule).Add(tokens)
		return
	}
	o.settled.WithLabelValues(rule, string(outcome)).Add(tokens)
}

// Queued implements engine.QueueObserver.
func (o *Observer) Queued(rule string, delta int) { o.queued.WithLabelValues(rule).Add(float64(delta)) }

// Waited implements engine.QueueObserver.
func (o *Observer) Waited(rule string, d time.Duration, allowed bool) {
	result := "denied"
	if allowed {
		result = "allowed"
	}
	o.waits.WithLabelValues(rule, result).Observe(d.Seconds())
}

// StoreError implements engine.Observer.
func (o *Observer) StoreError(error) { o.storeErrors.Inc() }

// StoreLatency implements engine.Observer.
func (o *Observer) StoreLatency(d time.Duration) { o.storeSeconds.Observe(d.Seconds()) }

// BreakerState implements engine.Observer.
func (o *Observer) BreakerState(state string) {
	for _, s := range []string{engine.BreakerClosed, engine.BreakerOpen, engine.BreakerHalfOpen} {
		v := 0.0
		if s == state {
			v = 1
		}
		o.circuit.WithLabelValues(s).Set(v)
	}
}

// isMoney reports whether a cost_from_response counts a call's price
// ("openai:money").
func isMoney(api string) bool {
	_, part, ok := llm.ParseName(api)
	return ok && part == llm.Money
}
