package main

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/driplimit/drip/store/leased"
)

// leasedCollector is the metrics of leased tokens on /metrics: the
// instance's leased.Stats, read at each scrape.
type leasedCollector struct{ ls *leased.Store }

var leasedDescs = struct {
	decisions, local, calls, blocks, lost, held *prometheus.Desc
}{
	decisions: prometheus.NewDesc("drip_leased_decisions_total", "Takes of leased limits (one call of several items counts once).", nil, nil),
	local:     prometheus.NewDesc("drip_leased_local_total", "Takes of leased limits decided without a store call (from a block, or a store denial repeated).", nil, nil),
	calls:     prometheus.NewDesc("drip_leased_store_calls_total", "Store calls of leased limits, block takes and returns included.", nil, nil),
	blocks:    prometheus.NewDesc("drip_leased_blocks_total", "Blocks of leased tokens, by what became of them: fetched, returned, or expired (ran out their life, or their return failed).", []string{"event"}, nil),
	lost:      prometheus.NewDesc("drip_leased_tokens_lost_total", "Tokens of blocks that expired unused: counted as granted, never granted.", nil, nil),
	held:      prometheus.NewDesc("drip_leased_tokens_held", "Tokens unused in the instance's live blocks now: granted by the store, not yet by the instance.", nil, nil),
}

func (c leasedCollector) Describe(ch chan<- *prometheus.Desc) {
	d := leasedDescs
	for _, x := range []*prometheus.Desc{d.decisions, d.local, d.calls, d.blocks, d.lost, d.held} {
		ch <- x
	}
}

func (c leasedCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.ls.Stats()
	d := leasedDescs
	const micro = 1e6
	ch <- prometheus.MustNewConstMetric(d.decisions, prometheus.CounterValue, float64(s.Decisions))
	ch <- prometheus.MustNewConstMetric(d.local, prometheus.CounterValue, float64(s.Local))
	ch <- prometheus.MustNewConstMetric(d.calls, prometheus.CounterValue, float64(s.StoreCalls))
	ch <- prometheus.MustNewConstMetric(d.blocks, prometheus.CounterValue, float64(s.Fetched), "fetched")
	ch <- prometheus.MustNewConstMetric(d.blocks, prometheus.CounterValue, float64(s.Returned), "returned")
	ch <- prometheus.MustNewConstMetric(d.blocks, prometheus.CounterValue, float64(s.Expired), "expired")
	ch <- prometheus.MustNewConstMetric(d.lost, prometheus.CounterValue, float64(s.TokensLost)/micro)
	ch <- prometheus.MustNewConstMetric(d.held, prometheus.GaugeValue, float64(s.TokensHeld)/micro)
}

// leasedRules counts blocks and their tokens per rule (a leased.Observer):
// drip_leased_rule_blocks_total{rule,event} and
// drip_leased_rule_tokens_total{rule,event}. Blocks are few (one per
// block's worth of decisions), so naming a key's rule on each is cheap.
// The rule label is bounded by the rules in force: ruleOf (the server's
// RuleOf, set once it exists) names "envoy" for Envoy's limits and ""
// for any other key, and the series of a rule a reload took out of force
// are deleted at the next scrape or the next new rule counted, so that
// rules that come and go do not pile up.
type leasedRules struct {
	ruleOf atomic.Pointer[func(string) string]
	blocks *prometheus.CounterVec
	tokens *prometheus.CounterVec

	mu   sync.Mutex
	seen map[string]bool // the rule labels counted and not yet deleted
}

func newLeasedRules() *leasedRules {
	return &leasedRules{
		blocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drip_leased_rule_blocks_total",
			Help: "Blocks of leased tokens of each rule (envoy: Envoy's limits), by what became of them: fetched, returned, or expired.",
		}, []string{"rule", "event"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drip_leased_rule_tokens_total",
			Help: "Tokens of each rule's blocks: fetched (taken from the store in blocks), returned (given back unused) or lost (expired unused: counted as granted, never granted).",
		}, []string{"rule", "event"}),
		seen: map[string]bool{},
	}
}

func (o *leasedRules) rule(key string) string {
	if f := o.ruleOf.Load(); f != nil {
		return (*f)(key)
	}
	return ""
}

func (o *leasedRules) count(key, event, tokens string, micro int64) {
	r := o.rule(key)
	o.mu.Lock() // blocks are few: a lock each is cheap
	defer o.mu.Unlock()
	if !o.seen[r] {
		o.forget()
		o.seen[r] = true
	}
	o.blocks.WithLabelValues(r, event).Inc()
	o.tokens.WithLabelValues(r, tokens).Add(float64(micro) / 1e6)
}

// forget deletes the series of the rules no longer in force (a rule's
// keys are "name|..."; "envoy" and "" always are). Called under mu.
func (o *leasedRules) forget() {
	for r := range o.seen {
		if r == "" || r == "envoy" || o.rule(r+"|") == r {
			continue
		}
		o.blocks.DeletePartialMatch(prometheus.Labels{"rule": r})
		o.tokens.DeletePartialMatch(prometheus.Labels{"rule": r})
		delete(o.seen, r)
	}
}

// Describe and Collect make leasedRules the collector of its two
// families, forgetting the rules out of force first.
func (o *leasedRules) Describe(ch chan<- *prometheus.Desc) {
	o.blocks.Describe(ch)
	o.tokens.Describe(ch)
}

func (o *leasedRules) Collect(ch chan<- prometheus.Metric) {
	o.mu.Lock()
	o.forget()
	o.mu.Unlock()
	o.blocks.Collect(ch)
	o.tokens.Collect(ch)
}

func (o *leasedRules) BlockFetched(key string, size int64) { o.count(key, "fetched", "fetched", size) }
func (o *leasedRules) BlockReturned(key string, left int64) {
	o.count(key, "returned", "returned", left)
}
func (o *leasedRules) BlockExpired(key string, lost int64) { o.count(key, "expired", "lost", lost) }
