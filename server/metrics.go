package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit/promobserver"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/server/envoy"
	"github.com/driplimit/drip/store"
)

// metrics are the server's Prometheus series, in a registry of its own so
// that several servers can live in one process (tests do). Every series
// whose labels are known up front exists from the start, at 0 (the
// rules' decisions once loaded: promobserver's Expect), so that
// increase() sees its first event.
type metrics struct {
	reg *prometheus.Registry

	// obs is the engine's observer: drip_decisions_total,
	// drip_shadow_denials_total, drip_local_fallback_decisions_total and
	// drip_store_circuit_state, the series of promobserver.
	obs *promobserver.Observer

	storeSeconds *prometheus.HistogramVec
	storeErrors  *prometheus.CounterVec // op
	reloads      *prometheus.CounterVec // result
	rulesOK      prometheus.Gauge
	rulesLoaded  prometheus.Gauge
	envoyLimits  prometheus.Gauge
	reloadTime   prometheus.Gauge

	// inForce are the names decisions are counted under (rules, and
	// Envoy limits with envoyPrefix), each with its mode, as the last
	// load set them; gone are those it took out of force. expect keeps
	// them, under the server's rules lock.
	inForce map[series]bool
	gone    []series
	// envoyN is the number of Envoy limits in force.
	envoyN int
}

// series is a name decisions are counted under, in one mode.
type series struct {
	name string
	mode rules.Mode
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		obs: promobserver.New(promobserver.WithoutStore()),
		storeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "drip_store_duration_seconds",
			Help:    "Latency of store calls by operation.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drip_store_errors_total",
			Help: "Store calls that failed or timed out (bad input is not counted), by operation.",
		}, []string{"op"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drip_rules_reloads_total",
			Help: "Rules reloads by result (ok, error). A failed reload keeps the previous rules.",
		}, []string{"result"}),
		rulesOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "drip_rules_last_reload_ok",
			Help: "1 if the last rules load succeeded, 0 if the file on disk is bad and older rules are in force.",
		}),
		rulesLoaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "drip_rules_loaded",
			Help: "Number of rules in force.",
		}),
		envoyLimits: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "drip_envoy_limits_loaded",
			Help: "Number of Envoy rate limits in force (files or the xDS server's last snapshot); 0: every ShouldRateLimit call is OK.",
		}),
		reloadTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "drip_rules_last_reload_timestamp_seconds",
			Help: "When the rules in force were loaded (Unix time).",
		}),
	}
	for _, op := range storeOps {
		m.storeSeconds.WithLabelValues(op)
		m.storeErrors.WithLabelValues(op)
	}
	for _, result := range []string{"ok", "error"} {
		m.reloads.WithLabelValues(result)
	}
	m.reg.MustRegister(m.obs, m.storeSeconds, m.storeErrors,
		m.reloads, m.rulesOK, m.rulesLoaded, m.envoyLimits, m.reloadTime,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// expect creates at zero the decision series of set's rules and env's
// limits, so that increase() sees their first decisions, and deletes the
// series of the rules and limits no longer in force, so that /metrics and
// memory follow the configuration in force whatever came before. Names
// that left are forgotten again at the next load: a decision under way
// during this one may count once more under its old name.
func (m *metrics) expect(set *rules.Set, env *envoy.Config) {
	limits := env.Limits()
	now := make(map[series]bool, len(set.Rules)+len(limits))
	names := make(map[string]bool, len(now))
	m.obs.Expect(set.Rules...)
	for _, r := range set.Rules {
		now[series{r.Name, r.Mode}], names[r.Name] = true, true
	}
	for _, l := range limits {
		mode := rules.Enforce
		if l.Shadow {
			mode = rules.Shadow
		}
		events := []engine.Event{engine.Allowed, engine.Denied, engine.NotTaken, engine.Refunded, engine.Failed}
		if l.Unlimited {
			events = []engine.Event{engine.Unlimited}
		}
		name := envoyPrefix + l.Label()
		m.obs.ExpectEvents(name, mode, events...)
		now[series{name, mode}], names[name] = true, true
	}
	var gone []series
	for k := range m.inForce {
		if !now[k] {
			gone = append(gone, k)
		}
	}
	for _, k := range append(m.gone, gone...) {
		switch {
		case now[k]: // back in force
		case names[k.name]: // in force under another mode
			m.obs.ForgetMode(k.name, k.mode)
		default:
			m.obs.Forget(k.name, k.mode)
		}
	}
	m.inForce, m.gone = now, gone
	m.envoyN = len(limits)
	m.envoyLimits.Set(float64(m.envoyN))
}

// storeOps are the values of the store series' op label.
var storeOps = []string{"take", "peek", "refund", "multi", "reset"}

// observed is a store.Store that times every call and counts failures: the
// store latency and error series. Telemetry stays out of the stores
// themselves.
type observed struct {
	store.Store
	take, peek, refund, multi, reset prometheus.Observer
	errs                             *prometheus.CounterVec
}

func (m *metrics) observe(s store.Store) *observed {
	return &observed{
		Store:  s,
		take:   m.storeSeconds.WithLabelValues("take"),
		peek:   m.storeSeconds.WithLabelValues("peek"),
		refund: m.storeSeconds.WithLabelValues("refund"),
		multi:  m.storeSeconds.WithLabelValues("multi"),
		reset:  m.storeSeconds.WithLabelValues("reset"),
		errs:   m.storeErrors,
	}
}

func (o *observed) obs(op bucket.Op) (prometheus.Observer, string) {
	switch op {
	case bucket.Peek:
		return o.peek, "peek"
	case bucket.Refund:
		return o.refund, "refund"
	}
	return o.take, "take"
}

// Apply implements store.Store: a call of one item under its op, of
// several as "multi". Caps come from the embedded store, so an in-process
// store stays one for the engine.
func (o *observed) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	start := time.Now()
	err := o.Store.Apply(ctx, op, at, items, results)
	h, name := o.obs(op)
	if len(items) > 1 {
		h, name = o.multi, "multi"
	}
	h.Observe(time.Since(start).Seconds())
	if err != nil && !store.IsInput(err) {
		o.errs.WithLabelValues(name).Inc()
	}
	return err
}

// Reset implements store.Store.
func (o *observed) Reset(ctx context.Context, key string) error {
	start := time.Now()
	err := o.Store.Reset(ctx, key)
	o.reset.Observe(time.Since(start).Seconds())
	if err != nil && !store.IsInput(err) {
		o.errs.WithLabelValues("reset").Inc()
	}
	return err
}
