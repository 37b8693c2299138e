package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/strictjson"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// Per-tenant overrides on the admin listener (package override):
//   PUT    /v1/admin/overrides/{rule}/{value}     body: a limit, {"rate": 1000, "burst": 2000}
//   PUT    /v1/admin/overrides/{rule}?value=V[&value=V2...]
//   DELETE /v1/admin/overrides/{rule}/{value}, or ?value=...
//   GET    /v1/admin/overrides[?rule=NAME]
// The rule must be one in force; its values name the bucket as the
// decision API's "values" do. The limit's "rate" is required, its burst
// is the rate unless given (as in every limit), any other field left out
// is the rule's (period, refill, start, max_reserved), and the algorithm
// cannot change. A concurrency rule's override sets max_in_flight
// (required) and lease_ttl (else the rule's).

// maxOverrideBody bounds a PUT's body: a limit is a few dozen bytes.
const maxOverrideBody = 4 << 10

// maxOverridePeriod bounds an override's period and start: a year, the
// longest unit of the Envoy limits drip serves. A period no client sees
// the end of would hold a tenant's spent tokens for ever.
const maxOverridePeriod = 365 * 24 * time.Hour

// overrideTimeout is the deadline of an override's store call: changes
// are rare, and one on PostgreSQL counts the overrides it bounds.
const overrideTimeout = 5 * time.Second

// overridesOff answers when the store keeps no overrides.
func (s *Server) overridesOff(w http.ResponseWriter) bool {
	if s.ost == nil {
		writeJSON(w, http.StatusNotImplemented, map[string]string{"error": "this store keeps no overrides"})
		return true
	}
	return false
}

// overrideTarget is the rule and bucket a PUT or DELETE names.
func (s *Server) overrideTarget(r *http.Request) (*rules.Rule, []string, string, error) {
	ru, err := s.rule(r.PathValue("rule"))
	if err != nil {
		return nil, nil, "", err
	}
	vals := r.URL.Query()["value"]
	if v := r.PathValue("value"); v != "" {
		if len(vals) > 0 {
			return nil, nil, "", inputf("give the value in the path or as ?value=, not both")
		}
		vals = []string{v}
	}
	n := 0
	for _, v := range vals {
		n += len(v)
		if !utf8.ValidString(v) { // JSON, which keys values below, would alter it
			return nil, nil, "", inputf("a value is not valid UTF-8")
		}
	}
	if n > store.MaxKeyLen {
		return nil, nil, "", inputf("values over %d bytes together", store.MaxKeyLen)
	}
	list, _ := json.Marshal(vals)
	if len(vals) == 0 {
		list = nil
	}
	key, err := ruleKey(ru, list, s.rules())
	if err != nil {
		return nil, nil, "", err
	}
	if vals == nil {
		vals = []string{}
	}
	return ru, vals, key, nil
}

// overrideLimit is the limit a PUT body sets for ru's bucket: ru's limit
// with the fields the body has. A token bucket or fixed window needs
// "rate" and gets a burst of the rate if it has none; a concurrency rule
// needs "max_in_flight", and keeps its lease TTL unless "lease_ttl" says.
func overrideLimit(ru *rules.Rule, body []byte) (drip.Limit, error) {
	var in drip.Limit
	if err := json.Unmarshal(body, &in); err != nil {
		return drip.Limit{}, inputf("bad limit: %v", err)
	}
	has, err := limitFields(body)
	if err != nil {
		return drip.Limit{}, err
	}
	l := ru.Limit
	if _, ok := has["algorithm"]; ok && algo(in.Algorithm) != algo(l.Algorithm) {
		return drip.Limit{}, inputf("an override keeps the rule's algorithm, %s", algo(l.Algorithm))
	}
	if l.Algorithm == drip.Concurrency {
		if _, ok := has["max_in_flight"]; !ok {
			return drip.Limit{}, inputf(`the limit of a concurrency rule needs "max_in_flight"`)
		}
		for _, f := range bucketNames {
			if _, ok := has[f]; ok {
				return drip.Limit{}, inputf("%q does not apply to a concurrency rule", f)
			}
		}
		l.MaxInFlight = in.MaxInFlight
		if _, ok := has["lease_ttl"]; ok {
			l.LeaseTTL = in.LeaseTTL
		}
		if err := l.Validate(); err != nil {
			return drip.Limit{}, inputf("%v", err)
		}
		return l, nil
	}
	for _, f := range []string{"max_in_flight", "lease_ttl"} {
		if _, ok := has[f]; ok {
			return drip.Limit{}, inputf("%q applies to concurrency rules only", f)
		}
	}
	if _, ok := has["rate"]; !ok {
		return drip.Limit{}, inputf(`the limit needs "rate"`)
	}
	l.Rate = in.Rate
	if _, ok := has["period"]; ok {
		l.Period = in.Period
	}
	l.Burst = l.Rate // as in every limit of drip: a burst left out is the rate
	if _, ok := has["burst"]; ok {
		l.Burst = in.Burst
	}
	if _, ok := has["refill"]; ok {
		l.Refill = in.Refill
	}
	if _, ok := has["start"]; ok {
		l.Start = in.Start
	}
	if _, ok := has["max_reserved"]; ok {
		l.MaxReserved = in.MaxReserved
	}
	if err := l.Validate(); err != nil {
		return drip.Limit{}, inputf("%v", err)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"period", l.Period}, {"start", l.Start}} {
		if _, ok := has[f.name]; ok && f.d > maxOverridePeriod {
			return drip.Limit{}, inputf("%q must be at most 8760h (a year), not %s", f.name, f.d)
		}
	}
	if cost := ruleCost(ru); (&engine.Item{Limit: l, Cost: cost}).Never() {
		return drip.Limit{}, inputf("burst %g is below the rule's cost %g: no request could pass", l.Burst, cost)
	}
	return l, nil
}

// limitFields are the fields of a limit object, each once and spelled
// exactly (strictjson): which fields a body has decides what it sets.
func limitFields(body []byte) (map[string]json.RawMessage, error) {
	if err := strictjson.Check(body, ""); err != nil {
		return nil, inputf("bad limit: %v", err)
	}
	var has map[string]json.RawMessage
	if err := json.Unmarshal(body, &has); err != nil || has == nil {
		return nil, inputf("bad limit: want a JSON object")
	}
	for name := range has {
		if !slices.Contains(limitNames, name) {
			return nil, inputf("bad limit: unknown field %q", name)
		}
	}
	return has, nil
}

// limitNames are the fields of a limit in JSON (drip's json.go);
// bucketNames those of token buckets and fixed windows only.
var (
	limitNames  = append([]string{"algorithm", "max_in_flight", "lease_ttl"}, bucketNames...)
	bucketNames = []string{"rate", "period", "burst", "refill", "start", "max_reserved"}
)

func algo(a drip.Algorithm) drip.Algorithm {
	if a == "" {
		return drip.TokenBucket
	}
	return a
}

func (s *Server) putOverride(w http.ResponseWriter, r *http.Request) {
	if s.overridesOff(w) {
		return
	}
	ru, vals, key, err := s.overrideTarget(r)
	if err != nil {
		writeError(w, err)
		return
	}
	body, err := readBody(w, r, maxOverrideBody, nil)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			writeError(w, errorf(http.StatusRequestEntityTooLarge, "body over %d bytes", maxOverrideBody))
			return
		}
		writeError(w, inputf("reading the body: %v", err))
		return
	}
	l, err := overrideLimit(ru, body)
	if err != nil {
		writeError(w, err)
		return
	}
	e := override.Entry{Rule: ru.Name, Values: vals, Key: key, Limit: l, Updated: time.Now().UTC()}
	ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
	defer cancel()
	if err := override.Set(ctx, s.ost, e); err != nil {
		if errors.Is(err, store.ErrOverridesFull) {
			err = errorf(http.StatusConflict, "%d overrides are set already: delete some first", override.MaxOverrides)
		}
		writeError(w, err)
		return
	}
	// Not the key: its values may be secrets (an API key).
	s.log.Info("drip serve: override set by the admin API", "rule", ru.Name, "limit", l)
	s.refreshOverrides(ctx)
	writeJSON(w, http.StatusOK, e)
}

func (s *Server) deleteOverride(w http.ResponseWriter, r *http.Request) {
	if s.overridesOff(w) {
		return
	}
	ru, _, key, err := s.overrideTarget(r)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
	defer cancel()
	found, err := s.ost.DeleteOverride(ctx, key)
	if err != nil {
		writeError(w, err)
		return
	}
	if !found {
		writeError(w, errorf(http.StatusNotFound, "no override of rule %q for that key", ru.Name))
		return
	}
	s.log.Info("drip serve: override deleted by the admin API", "rule", ru.Name)
	s.refreshOverrides(ctx)
	writeJSON(w, http.StatusOK, map[string]any{"deleted": true, "rule": ru.Name, "key": key})
}

// listedOverride is an override as GET lists it: stale (and why) when it
// cannot apply to its rule in force (stale.go).
type listedOverride struct {
	override.Entry
	Stale       bool   `json:"stale,omitempty"`
	StaleReason string `json:"stale_reason,omitempty"`
}

// listOverrides lists the overrides the store holds now (not this
// instance's snapshot of them), by key, optionally of one rule, each
// marked stale when it cannot apply to its rule in force.
func (s *Server) listOverrides(w http.ResponseWriter, r *http.Request) {
	if s.overridesOff(w) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), overrideTimeout)
	defer cancel()
	f := override.NewFollower(s.ost)
	if err := f.Refresh(ctx); err != nil {
		writeError(w, err)
		return
	}
	rule := r.URL.Query().Get("rule")
	set := s.rules()
	out := []listedOverride{}
	for _, e := range f.Snapshot().Entries() {
		if rule == "" || e.Rule == rule {
			why := staleReason(set, e)
			out = append(out, listedOverride{e, why != "", why})
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"overrides": out})
}

// refreshOverrides makes a change visible on this instance at once,
// rather than at its next notification or poll.
func (s *Server) refreshOverrides(ctx context.Context) {
	if s.ovr != nil {
		_ = s.ovr.Refresh(ctx)
	}
}

// startLoadTimeout bounds how long Serve waits for the overrides before
// it serves: a store that is down at start delays serving no longer.
const startLoadTimeout = 2 * time.Second

// followOverrides loads the overrides before the listeners serve (so that
// a restarted instance applies them from its first request, unless the
// store does not answer within startLoadTimeout: then they follow) and
// keeps them current until ctx ends.
func (s *Server) followOverrides(ctx context.Context, wg *sync.WaitGroup) {
	opts := append([]override.Option{override.WithLogger(s.log), override.OnChange(s.overridesChanged)}, s.ovrOpts...)
	s.ovr = override.NewFollower(s.ost, opts...)
	s.metrics.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "drip_overrides",
			Help: "Per-tenant overrides in force on this instance.",
		}, func() float64 { return float64(s.ovr.Snapshot().Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "drip_overrides_stale",
			Help: "Overrides in force on this instance that do not apply: set before their rule's algorithm changed, until replaced or deleted.",
		}, func() float64 { return float64(s.staleCount()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "drip_overrides_version",
			Help: "The store's version of the overrides in force on this instance: every instance sharing the store shows the same once a change has reached it.",
		}, func() float64 { return float64(s.ovr.Snapshot().Version()) }))
	lctx, cancel := context.WithTimeout(ctx, startLoadTimeout)
	if err := s.ovr.Refresh(lctx); err != nil {
		s.log.Warn("drip serve: loading the overrides failed; retrying in the background", "err", err)
	}
	cancel()
	wg.Go(func() { s.ovr.Run(ctx) })
}
