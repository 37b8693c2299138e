package drip

import (
	"time"

	"github.com/driplimit/drip/bucket"
)

// Decision is the answer to one request. Being over the limit is a
// decision (Allowed false), never an error.
type Decision struct {
	// Allowed reports whether the request may proceed (for a reservation:
	// whether the tokens were reserved; see RetryAfter).
	Allowed bool
	// Tokens is the bucket's content after the decision, in tokens: for a
	// denial, what was available. It is negative while a reservation is in
	// debt. Precision is one millionth of a token.
	Tokens float64
	// Remaining is Tokens rounded down, and at least 0.
	Remaining int64
	// Burst is the bucket's capacity, in tokens ("limit" in JSON).
	Burst float64
	// RetryAfter is how long until a request of the same cost would be
	// allowed; 0 when allowed. For a granted reservation, it is when the
	// reserved work may run: when the debt is repaid.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
}

// Multi is the answer to a multi-take: Allowed only if every request was,
// in which case all were applied; otherwise none was.
type Multi struct {
	// Allowed reports whether every request was allowed and so applied.
	Allowed bool
	// RetryAfter is the largest RetryAfter among the denied requests, or
	// among all requests when every one was allowed.
	RetryAfter time.Duration
	// Decisions holds each request's own decision at that moment, in order,
	// whether or not the whole was applied.
	Decisions []Decision
}

// combine builds a Multi from per-request decisions.
func combine(ds []Decision) Multi {
	m := Multi{Allowed: true, Decisions: ds}
	for _, d := range ds {
		if !d.Allowed {
			if m.Allowed {
				m.Allowed = false
				m.RetryAfter = 0
			}
			m.RetryAfter = max(m.RetryAfter, d.RetryAfter)
		} else if m.Allowed {
			m.RetryAfter = max(m.RetryAfter, d.RetryAfter)
		}
	}
	return m
}

// DecisionOf is the Decision of a store's result for an item of a limit
// of burst micro-tokens (its bucket.Params.Burst): its amounts in tokens.
func DecisionOf(r bucket.Result, burst int64) Decision {
	return Decision{
		Allowed:    r.Allowed,
		Tokens:     float64(r.Tokens) / bucket.Micro,
		Remaining:  max(0, r.Tokens) / bucket.Micro,
		Burst:      float64(burst) / bucket.Micro,
		RetryAfter: r.RetryAfter,
		ResetAfter: r.ResetAfter,
	}
}
