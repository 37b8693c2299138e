package bucket

import (
	"math"
	"time"
)

// This file is the math of a concurrency limit (Kind Concurrency): a key
// holds a set of leases, each an ID and the instant it expires, and a take
// acquires one of Burst/Micro slots. Like Eval it is a pure function; the
// Lua and SQL versions in the stores are held to it by storetest.

// Concurrency is the kind of a concurrency limit: Burst is the number of
// slots in micro-tokens (slots * Micro, so that a Decision's Burst and
// Remaining count slots) and Period the lease TTL in nanoseconds. Rate,
// MaxReserved and Start are unused.
const Concurrency Kind = 3

// Lease is one held slot of a concurrency limit: who holds it, and until
// when (nanoseconds; it is free from Exp on).
type Lease struct {
	ID  string
	Exp int64
}

// Slots is the number of slots of a concurrency limit's params.
func (p Params) Slots() int64 { return p.Burst / Micro }

// LeaseExp is the expiry of a lease acquired (or renewed) at now: now plus
// the TTL, saturating.
func (p Params) LeaseExp(now int64) int64 {
	if now > 0 && p.Period > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + p.Period
}

// EvalLeases decides a request on a concurrency limit p, with lease id,
// against the key's leases ls (in any order; expired ones may be among
// them) at now. It returns the result, the leases to store (the live ones,
// in the order of ls, a new lease last) and whether they must be written.
//
//   - Take acquires a slot for id: allowed if id already holds one (its
//     expiry is renewed) or if fewer than Slots leases are live; a denial
//     writes nothing and its RetryAfter is how long until the earliest live
//     lease expires (an upper bound: a release may free a slot sooner).
//   - Peek decides as Take would and writes nothing; with an empty id it
//     asks whether a slot is free.
//   - Refund releases id's slot; releasing a lease that is not held
//     (unknown, released already, expired) is allowed and changes nothing
//     but the purge of expired leases.
//
// The result's Tokens is the number of free slots (in micro-tokens) after
// the decision, ResetAfter how long until every live lease has expired.
func EvalLeases(op Op, ls []Lease, p Params, id string, now int64) (Result, []Lease, bool) {
	live := make([]Lease, 0, len(ls)+1)
	held := -1
	earliest := int64(math.MaxInt64)
	for _, l := range ls {
		if l.Exp <= now {
			continue
		}
		if l.ID == id && id != "" {
			held = len(live)
		}
		live = append(live, l)
	}
	purged := len(live) != len(ls)
	slots := p.Slots()
	switch op {
	case Refund:
		if held >= 0 {
			live = append(live[:held], live[held+1:]...)
		}
		return leaseResult(true, live, slots, 0, now), live, held >= 0 || purged
	}
	allowed := held >= 0 || int64(len(live)) < slots
	if !allowed {
		for _, l := range live {
			earliest = min(earliest, l.Exp)
		}
		return leaseResult(false, live, slots, untilAt(earliest, now), now), live, false
	}
	if op == Peek {
		n := live
		if held < 0 && id != "" {
			n = append(n[:len(n):len(n)], Lease{ID: id, Exp: p.LeaseExp(now)})
		}
		return leaseResult(true, n, slots, 0, now), live, false
	}
	exp := p.LeaseExp(now)
	if held >= 0 {
		live[held].Exp = exp
	} else {
		live = append(live, Lease{ID: id, Exp: exp})
	}
	return leaseResult(true, live, slots, 0, now), live, true
}

// leaseResult is the Result of a concurrency decision whose leases after
// are ls.
func leaseResult(allowed bool, ls []Lease, slots int64, retry time.Duration, now int64) Result {
	var latest int64
	for _, l := range ls {
		latest = max(latest, l.Exp)
	}
	return Result{
		Allowed:    allowed,
		Tokens:     max(0, slots-int64(len(ls))) * Micro,
		RetryAfter: retry,
		ResetAfter: untilAt(latest, now),
	}
}

// LeasesExpireAt is when the leases ls all have expired, so a store may
// drop the key: the latest expiry (0 for none).
func LeasesExpireAt(ls []Lease) int64 {
	var latest int64
	for _, l := range ls {
		latest = max(latest, l.Exp)
	}
	return latest
}
