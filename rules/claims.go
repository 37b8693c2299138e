package rules

import (
	"math"
	"strconv"

	"github.com/driplimit/drip"
)

// ClaimLimit is a rule's limit_from_claims: the rate and burst of a
// request's bucket read from claims of its verified bearer token, each
// clamped to its bounds. A claim that is missing, not a number or not
// above 0 leaves the rule's own value; everything else (period,
// algorithm) is the rule's.
type ClaimLimit struct {
	// RateClaim and BurstClaim name the claims; either may be empty.
	RateClaim  string `json:"rate_claim,omitempty"`
	BurstClaim string `json:"burst_claim,omitempty"`
	// MinRate, MaxRate, MinBurst and MaxBurst are the bounds a claimed
	// value is clamped to (the minimums default to 1). The JSON form is
	// the rules file's.
	MinRate  float64 `json:"min_rate"`
	MaxRate  float64 `json:"max_rate,omitempty"`
	MinBurst float64 `json:"min_burst"`
	MaxBurst float64 `json:"max_burst,omitempty"`
}

var claimFields = []string{"rate_claim", "burst_claim", "min_rate", "max_rate", "min_burst", "max_burst"}

// LimitFor is the limit of r for a request whose values value reads:
// r.Limit with the rate and burst its limit_from_claims reads, if any. ok
// is false when r.Limit applies as it is.
func (r *Rule) LimitFor(value func(Source) (string, bool)) (l drip.Limit, ok bool) {
	c := r.Claims
	l = r.Limit
	if c == nil {
		return l, false
	}
	if x, found := claimAmount(value, c.RateClaim); found {
		l.Rate, ok = min(max(x, c.MinRate), c.MaxRate), true
	}
	if x, found := claimAmount(value, c.BurstClaim); found {
		l.Burst, ok = min(max(x, c.MinBurst), c.MaxBurst), true
	}
	if l.Algorithm == drip.SlidingWindow || l.Calendar != "" {
		l.Burst = l.Rate // its limit is its rate (it has no burst_claim)
	}
	if ok && l.Validate() != nil { // cannot happen with checked bounds
		return r.Limit, false
	}
	return l, ok
}

func claimAmount(value func(Source) (string, bool), claim string) (float64, bool) {
	if claim == "" {
		return 0, false
	}
	s, ok := value(Source{Kind: KindJWT, Name: claim})
	if !ok {
		return 0, false
	}
	x, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(x) || math.IsInf(x, 0) || x <= 0 {
		return 0, false
	}
	return x, true
}

// claims checks a rule's limit_from_claims.
func (c *checker) claims(p string, v any, r *Rule) *ClaimLimit {
	f, ok := c.object(p, v)
	if !ok {
		return nil
	}
	if r.Limit.Algorithm == drip.Concurrency {
		// Claims give a rate and a burst; a concurrency rule has neither
		// (its per-tenant limits are overrides of max_in_flight).
		c.add(p, "a concurrency rule has no rate or burst for claims to set: use a per-tenant override of max_in_flight")
		return nil
	}
	cl := &ClaimLimit{MinRate: 1, MinBurst: 1}
	n := len(c.problems)
	claim := func(name string) string {
		v, fp, ok := f.get(name)
		if !ok {
			return ""
		}
		s, ok := c.str(fp, v)
		if ok && s == "" {
			c.add(fp, "must name a claim")
		}
		return s
	}
	bound := func(name string, def float64, needed bool) float64 {
		v, fp, ok := f.get(name)
		if !ok {
			if needed {
				c.add(field(p, name), "required: a claimed value is clamped to it")
			}
			return def
		}
		x, _ := c.amount(fp, v)
		return x
	}
	cl.RateClaim, cl.BurstClaim = claim("rate_claim"), claim("burst_claim")
	if cl.BurstClaim != "" && (r.Limit.Algorithm == drip.SlidingWindow || r.Limit.Calendar != "") {
		c.add(field(p, "burst_claim"), "a sliding or calendar window has no burst apart from its rate: use rate_claim")
	}
	if cl.RateClaim == "" && cl.BurstClaim == "" && len(c.problems) == n {
		c.add(p, "rate_claim or burst_claim (or both) is required")
	}
	cl.MinRate = bound("min_rate", 1, false)
	cl.MaxRate = bound("max_rate", 0, cl.RateClaim != "")
	cl.MinBurst = bound("min_burst", 1, false)
	cl.MaxBurst = bound("max_burst", 0, cl.BurstClaim != "")
	f.done(claimFields...)
	if len(c.problems) > n {
		return cl
	}
	if cl.RateClaim != "" && cl.MinRate > cl.MaxRate {
		c.add(field(p, "min_rate"), "must be <= max_rate")
	}
	if cl.BurstClaim != "" {
		if cl.MinBurst > cl.MaxBurst {
			c.add(field(p, "min_burst"), "must be <= max_burst")
		}
		if cost := max(r.FixedCost, r.DefaultCost); cl.MinBurst < cost {
			c.add(field(p, "min_burst"), "must be >= the rule's cost (%s)", strconv.FormatFloat(cost, 'g', -1, 64))
		}
	}
	if len(c.problems) > n {
		return cl
	}
	// Every limit the claims can give is valid: check the corners.
	for _, rate := range []float64{cl.MinRate, cl.MaxRate} {
		for _, burst := range []float64{cl.MinBurst, cl.MaxBurst} {
			l := r.Limit
			if cl.RateClaim != "" {
				l.Rate = rate
			}
			if cl.BurstClaim != "" {
				l.Burst = burst
			}
			if l.Algorithm == drip.SlidingWindow || l.Calendar != "" {
				l.Burst = l.Rate // as LimitFor gives it
			}
			if err := l.Validate(); err != nil {
				c.add(p, "%v", err)
				return cl
			}
		}
	}
	return cl
}
