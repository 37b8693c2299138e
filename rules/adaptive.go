package rules

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store"
)

// AlgorithmAdaptive is the algorithm of a rule whose in-flight limit is
// learned in each instance from the latency and the failures of the
// requests it lets through (Rule.Adaptive).
const AlgorithmAdaptive = "adaptive"

// Adaptive is the algorithm_config of an adaptive rule: the bounds of
// the limit it learns and how it learns it. Every field has a default;
// none needs tuning.
type Adaptive struct {
	// InitialLimit (initial_limit, default 20) is the limit before any
	// request has completed.
	InitialLimit int
	// MinLimit and MaxLimit (min_limit, default 1; max_limit, default
	// 1000) bound the limit.
	MinLimit, MaxLimit int
	// Tolerance (tolerance, default 0.25) is how much a window's latency
	// may exceed the unloaded upstream's before the limit shrinks at
	// once. 0.25 lets it be 25% slower. The limit grows only within an
	// eighth of it, and eases toward the capacity it measured past that.
	Tolerance float64
	// Smoothing (smoothing, default 0.5) is the share of the way from the
	// limit to its new estimate that one window moves it down while the
	// latency is within twice the tolerance (1: all at once). Past that
	// it moves all the way, halving at most.
	Smoothing float64
	// Window (window, default 100ms) is the shortest window of completed
	// requests the limit learns from. A window also holds a few requests
	// at least, or lasts up to ten times this.
	Window time.Duration
	// DropStatus (drop_status, default 429, 502, 503 and 504) are the
	// statuses of an overloaded upstream. Such an answer shrinks the
	// limit, as does a request that did not complete.
	DropStatus StatusSet
	// LeaseTTL (lease_ttl, default 30s, above 0 and at most 24h) is how
	// long a slot acquired through the decision API stays held unless
	// released. Then it is given back and learned as a drop. It is the
	// rule's Limit.LeaseTTL too.
	LeaseTTL time.Duration
}

// Defaults of an adaptive rule's algorithm_config.
const (
	DefaultInitialLimit = 20
	DefaultMinLimit     = 1
	DefaultMaxLimit     = 1000
	DefaultTolerance    = 0.25
	DefaultSmoothing    = 0.5
	DefaultWindow       = 100 * time.Millisecond
)

// DefaultDropStatus is an adaptive rule's drop_status when it sets none.
var DefaultDropStatus = StatusSet{{429, 429}, {502, 504}}

var adaptiveFields = []string{"initial_limit", "min_limit", "max_limit", "tolerance", "smoothing", "window", "drop_status", "lease_ttl"}

// adaptiveConfig reads the algorithm_config of an adaptive rule. Its
// Limit is a concurrency limit of max_limit slots (what the headers
// describe at most); the slots are counted in each instance, never in
// the store.
func (c *checker) adaptiveConfig(f *fields, r *Rule) {
	a := &Adaptive{InitialLimit: DefaultInitialLimit, MinLimit: DefaultMinLimit, MaxLimit: DefaultMaxLimit,
		Tolerance: DefaultTolerance, Smoothing: DefaultSmoothing, Window: DefaultWindow, DropStatus: DefaultDropStatus,
		LeaseTTL: store.DefaultLeaseTTL}
	n := len(c.problems)
	intField := func(name string, dst *int) {
		if v, fp, ok := f.get(name); ok {
			if x, ok := c.integer(fp, v, 1, store.MaxInFlight); ok {
				*dst = x
			}
		}
	}
	intField("initial_limit", &a.InitialLimit)
	intField("min_limit", &a.MinLimit)
	intField("max_limit", &a.MaxLimit)
	if v, fp, ok := f.get("tolerance"); ok {
		if x, ok := c.num(fp, v); ok {
			if x < 0.01 || x > 10 {
				c.add(fp, "must be from 0.01 to 10")
			} else {
				a.Tolerance = x
			}
		}
	}
	if v, fp, ok := f.get("smoothing"); ok {
		if x, ok := c.share(fp, v); ok {
			a.Smoothing = x
		}
	}
	if v, fp, ok := f.get("window"); ok {
		if d, ok := c.duration(fp, v, false); ok {
			if d < time.Millisecond || d > time.Minute {
				c.add(fp, "must be from 1ms to 1m")
			} else {
				a.Window = d
			}
		}
	}
	if v, fp, ok := f.get("drop_status"); ok {
		a.DropStatus = c.countStatus(fp, v)
	}
	c.leaseTTL(f, &a.LeaseTTL)
	f.done(adaptiveFields...)
	if len(c.problems) == n {
		if a.MinLimit > a.MaxLimit {
			c.add(field(f.path, "min_limit"), "must be <= max_limit (%d)", a.MaxLimit)
		} else if a.InitialLimit < a.MinLimit || a.InitialLimit > a.MaxLimit {
			c.add(field(f.path, "initial_limit"), "must be from min_limit (%d) to max_limit (%d)", a.MinLimit, a.MaxLimit)
		}
	}
	r.Adaptive = a
	r.CostSource = Source{Kind: KindFixed}
	r.FixedCost, r.DefaultCost = defaultCost, defaultCost
	r.Limit = drip.Limit{Algorithm: drip.Concurrency, MaxInFlight: a.MaxLimit, LeaseTTL: a.LeaseTTL}
}

// Drops reports whether status tells of an upstream that is overloaded
// (DropStatus).
func (a *Adaptive) Drops(status int) bool { return a.DropStatus.Has(status) }

// The classes of priority a rule or a request names (priority,
// priority_from): a number from 0 (the least important) to 100, or one
// of these names.
const (
	PriorityBatch     = 0
	PrioritySheddable = 25
	PriorityDefault   = 50
	PriorityCritical  = 100
)

// DefaultReserve is a rule's reserve when it names priorities
// (priority_from) and sets none.
const DefaultReserve = 0.1

// MaxPriorityValue is the longest class a request may name.
const MaxPriorityValue = 16

// ParsePriority reads a class: critical, default, sheddable, batch, or a
// whole number from 0 to 100. ok is false for anything else (the class
// is then PriorityDefault).
func ParsePriority(s string) (p int, ok bool) {
	if len(s) > MaxPriorityValue {
		return PriorityDefault, false
	}
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "critical":
		return PriorityCritical, true
	case "default":
		return PriorityDefault, true
	case "sheddable":
		return PrioritySheddable, true
	case "batch":
		return PriorityBatch, true
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 || n > 100 {
		return PriorityDefault, false
	}
	return n, true
}

// PriorityName is the class of p as a response names it: its name for
// the four named classes, else the number.
func PriorityName(p int) string {
	switch p {
	case PriorityCritical:
		return "critical"
	case PriorityDefault:
		return "default"
	case PrioritySheddable:
		return "sheddable"
	case PriorityBatch:
		return "batch"
	}
	return strconv.Itoa(p)
}

// PriorityBand is the named class that p falls in: the highest of the
// four at or below it. critical is 100 alone, default 50 to 99,
// sheddable 25 to 49 and batch 0 to 24. A metric labels classes so: a
// client that names its class gets four series, not 101.
func PriorityBand(p int) int {
	switch {
	case p >= PriorityCritical:
		return PriorityCritical
	case p >= PriorityDefault:
		return PriorityDefault
	case p >= PrioritySheddable:
		return PrioritySheddable
	}
	return PriorityBatch
}

// Share is the share of the rule's capacity (its burst, its slots, its
// learned limit) that a request of class p may use: all of it for
// critical, 1-reserve for default, and linearly less below, down to
// 1-2*reserve for batch (at least 0). A rule that names no priorities
// (Reserve 0) gives every class all of it.
func (r *Rule) Share(p int) float64 {
	if r.Reserve <= 0 || p >= PriorityCritical {
		return 1
	}
	return max(0, 1-r.Reserve*float64(PriorityCritical-p)/float64(PriorityCritical-PriorityDefault))
}

// Class is the class of the rule's requests that name none: its
// priority, or PriorityDefault.
func (r *Rule) Class() int {
	if r.PrioritySet {
		return r.Priority
	}
	return PriorityDefault
}

// Prioritized reports whether the rule gives classes of priority
// different shares (a reserve).
func (r *Rule) Prioritized() bool { return r.Reserve > 0 }

// priorityFields reads a rule's priority, priority_from and reserve.
func (c *checker) priorityFields(f *fields, r *Rule) {
	if v, fp, ok := f.get("priority"); ok {
		text, _ := scalarText(v)
		if p, ok := ParsePriority(text); ok {
			r.Priority, r.PrioritySet = p, true
		} else {
			c.add(fp, "must be critical, default, sheddable, batch or a whole number from 0 to 100")
		}
	}
	if v, fp, ok := f.get("priority_from"); ok {
		if s, ok := c.str(fp, v); ok {
			src, err := ParseSource(s)
			switch {
			case err != nil:
				c.add(fp, "%v", err)
			case src.Kind != KindHeader && src.Kind != KindQuery && src.Kind != KindJWT && src.Kind != KindCookie:
				c.add(fp, "must be header:<name>, query:<name>, cookie:<name> or jwt:<claim>, not %q", s)
			default:
				r.PriorityFrom = &src
			}
		}
	}
	reserveSet := false
	if v, fp, ok := f.get("reserve"); ok {
		reserveSet = true
		x, ok := percent(v)
		if !ok || x < 0 || x > 0.5 || math.IsNaN(x) {
			c.add(fp, "must be a share from 0 to 0.5, or a percentage from \"0%%\" to \"50%%\"")
		} else {
			r.Reserve = x
		}
	}
	if !reserveSet && (r.PriorityFrom != nil || r.PrioritySet) {
		r.Reserve = DefaultReserve
	}
	if (r.PriorityFrom != nil || reserveSet) && r.Mode == Shadow {
		c.add(f.path, "priorities are for enforce rules only (a shadow rule never sheds)")
	}
}

// percent reads 0.1 or "10%".
func percent(v any) (float64, bool) {
	text, ok := scalarText(v)
	if !ok {
		return 0, false
	}
	if s, pc := strings.CutSuffix(text, "%"); pc {
		x, err := strconv.ParseFloat(s, 64)
		return x / 100, err == nil
	}
	x, err := strconv.ParseFloat(text, 64)
	return x, err == nil
}
