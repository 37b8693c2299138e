package bucket

import (
	"math"
	"time"
)

// This file is the math of a concurrency limit (Kind Concurrency): a key
// holds a set of leases, each an ID and the instant it expires, and a take
// acquires one of Slots. The decision is a pure function of a summary of
// the key's live leases (LeaseSet), which a store reads however it holds
// them (a list in memory, a sorted set in Redis, rows in PostgreSQL); the
// stores' scripts count and write, and the verdict is this file's.

// Concurrency is the kind of a concurrency limit: Burst is the number of
// slots in micro-tokens (slots * Micro, so that a Decision's Burst and
// Remaining count slots) and Period the lease TTL in nanoseconds. Rate,
// MaxReserved and Start are unused.
const Concurrency Kind = 3

// Holder is one held slot of a concurrency limit, as a store keeps it:
// the lease ID that holds it, and until when (nanoseconds; live while
// now < Exp).
type Holder struct {
	ID  string
	Exp int64
}

// Lease is the old name of Holder.
//
// Deprecated: use Holder. A Lease is what a caller holds
// (drip.Lease, from Limiter.Acquire).
type Lease = Holder

// LeaseSet is what a decision needs to know of a key's leases at now:
// how many are live, whether the request's own lease is among them, and
// the earliest and latest expiry among them (0 when none is live).
type LeaseSet struct {
	Live     int64
	Held     bool
	Earliest int64
	Latest   int64
}

// Slots is the number of slots of a concurrency limit's params.
func (p Params) Slots() int64 { return p.Burst / Micro }

// LeaseExp is the expiry of a lease acquired (or renewed) at now: now plus
// the TTL, rounded up to a whole microsecond (so that a store may keep
// expiries as exact doubles of microseconds), saturating.
func (p Params) LeaseExp(now int64) int64 {
	if now > 0 && p.Period > math.MaxInt64-now-1000 {
		return math.MaxInt64 / 1000 * 1000
	}
	return ceilDiv(now+p.Period, 1000) * 1000
}

// Leases summarizes the leases ls (any order, expired ones among them) for
// a request with lease id at now.
func Leases(ls []Holder, id string, now int64) LeaseSet {
	var s LeaseSet
	for _, l := range ls {
		if l.Exp <= now {
			continue
		}
		s.Live++
		s.Held = s.Held || (id != "" && l.ID == id)
		if s.Earliest == 0 || l.Exp < s.Earliest {
			s.Earliest = l.Exp
		}
		s.Latest = max(s.Latest, l.Exp)
	}
	return s
}

// EvalLeases decides a request (op, for the lease the set s was read for)
// on a concurrency limit p at now. It returns the result and whether the
// store must write (see NextLeases):
//
//   - Take acquires a slot: allowed if the lease already holds one (its
//     expiry is then renewed) or if fewer than Slots leases are live; a
//     denial writes nothing, and its RetryAfter is how long until the
//     earliest live lease expires (an upper bound: a holder may release
//     sooner).
//   - Peek decides as Take would and writes nothing; without a lease it
//     asks whether a slot is free.
//   - Refund releases the lease; releasing one that is not held (unknown,
//     released already, expired) is allowed and changes nothing else. It
//     writes (at least the purge of expired leases).
//
// The result's Tokens is the number of free slots (in micro-tokens) after
// the decision, and ResetAfter how long until every lease held after it
// has expired (for a release that leaves other leases, an upper bound: the
// released lease counts).
func (p Params) EvalLeases(op Op, s LeaseSet, lease string, now int64) (Result, bool) {
	slots := p.Slots()
	if op == Refund {
		live, latest := s.Live, s.Latest
		if s.Held {
			live--
		}
		if live == 0 {
			latest = 0 // every slot is free
		}
		return leaseResult(true, slots-live, 0, untilAt(latest, now)), true
	}
	if !s.Held && s.Live >= slots {
		return leaseResult(false, 0, untilAt(s.Earliest, now), untilAt(s.Latest, now)), false
	}
	live := s.Live
	if !s.Held && (op == Take || lease != "") {
		live++
	}
	latest := s.Latest
	if op == Take || lease != "" {
		latest = max(latest, p.LeaseExp(now))
	}
	return leaseResult(true, slots-live, 0, untilAt(latest, now)), op == Take
}

func leaseResult(allowed bool, free int64, retry, reset time.Duration) Result {
	return Result{Allowed: allowed, Tokens: max(0, free) * Micro, RetryAfter: retry, ResetAfter: reset}
}

// NextLeases is the leases to store after a decision that EvalLeases said
// to write: the live ones of ls at now, in their order, with lease
// acquired (appended) or renewed for a take, or removed for a refund.
func (p Params) NextLeases(op Op, ls []Holder, lease string, now int64) []Holder {
	next := make([]Holder, 0, len(ls)+1)
	held := false
	for _, l := range ls {
		switch {
		case l.Exp <= now:
		case l.ID != lease:
			next = append(next, l)
		case op == Take:
			held = true
			next = append(next, Holder{ID: lease, Exp: p.LeaseExp(now)})
		}
	}
	if op == Take && !held {
		next = append(next, Holder{ID: lease, Exp: p.LeaseExp(now)})
	}
	return next
}

// LeasesExpireAt is when the leases ls have all expired, so a store may
// drop the key: the latest expiry (0 for none).
func LeasesExpireAt(ls []Holder) int64 {
	var latest int64
	for _, l := range ls {
		latest = max(latest, l.Exp)
	}
	return latest
}
