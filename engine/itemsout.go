package engine

import (
	"math"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/seconds"
	"github.com/driplimit/drip/rules"
)

// The outcome of DecideItems, as its headers describe it: the same
// fields as Decide's, with what Envoy's descriptors add (quota mode,
// limits that allow nothing).

// enforced reports whether a is an enforced item that asks the store (not
// one that allows nothing).
func (a *Applied) enforced() bool {
	return (a.Mode == Enforce || a.Mode == EnforceQuota) && !a.blocked
}

// Current is the bucket as the request left it: its Decision, except
// for an item of DecideItems that its own bucket allowed but that was
// not taken (another denied), which shows the bucket as it was before
// (Decide's rules already show so).
func (a *Applied) Current() drip.Decision {
	if a.item && a.Decision.Allowed && !a.Changed && a.Mode != Refund && a.Mode != Charge {
		return beforeTake(a.Decision, a.plan(), a.Key, a.Taken)
	}
	return a.Decision
}

// pickItems chooses the item the single-value headers describe, and the
// Retry-After of a denial: on a denial, the denying item with the longest
// wait (else one that can never be allowed and was peeked, else the
// allowed one with the fewest tokens left; a limit that allows nothing,
// which no wait cures, before all: then no Retry-After); when allowed,
// the one with the fewest tokens left, or as many and longer to fill.
func (out *Outcome) pickItems() {
	var top, fallback, shut *Applied
	for i := range out.Applied {
		a := &out.Applied[i]
		if a.blocked {
			if !out.Allowed && a.Rule.Mode != rules.Shadow && shut == nil {
				shut = a
			}
			continue
		}
		enforced := a.enforced()
		if !a.Decided || (enforced && a.Never()) {
			if enforced && a.Decided && top == nil {
				top = a
			}
			continue
		}
		if !enforced {
			continue
		}
		d := &a.Decision
		switch {
		case out.Allowed:
			if top == nil || tighter(*d, top.Decision, false) {
				top = a
			}
		case !d.Allowed:
			if top == nil || tighter(*d, top.Decision, true) {
				top = a
			}
		case fallback == nil || d.Remaining < fallback.Decision.Remaining:
			fallback = a
		}
	}
	if top == nil {
		top = fallback
		if shut != nil {
			top = shut
		}
	}
	out.Top = top
	if top != nil && !out.Allowed && !top.blocked {
		// Envoy's configuration has no place for it: the default.
		out.Identity = top.Key
		out.RetryAfter = rules.DefaultJitter.Seconds(top.Key, out.itemsWait())
	}
}

// itemsWait is how long a denied request waits before it may be allowed:
// the longest wait of its items over their limit outside quota mode and,
// when none of its EnforceQuota items is within its limit, the shortest
// wait of theirs (those that no wait cures aside).
func (out *Outcome) itemsWait() time.Duration {
	var w, quota time.Duration
	quotas, within, waits := 0, false, false
	for i := range out.Applied {
		a := &out.Applied[i]
		denied := a.enforced() && a.Decided && !a.Decision.Allowed
		if a.Mode != EnforceQuota {
			if denied {
				w = max(w, a.Decision.RetryAfter)
			}
			continue
		}
		quotas++
		switch {
		case denied:
			if !waits || a.Decision.RetryAfter < quota {
				quota, waits = a.Decision.RetryAfter, true
			}
		case a.enforced() && a.Decided:
			within = true // allowed on its own
		}
	}
	if quotas > 0 && !within {
		w = max(w, quota)
	}
	return w
}

// itemFields are the header values of DecideItems' outcome: every
// enforced item decided, and every limit that allows nothing outside
// shadow mode (a quota of 0, no window).
func (out *Outcome) itemFields() Fields {
	if out.Top == nil {
		return Fields{}
	}
	fieldOf := func(a *Applied) field {
		f := field{policy: a.policy(), name: a.plan().name}
		switch {
		case a.blocked:
			f.noT = true
		case !out.Allowed && !a.Decision.Allowed && out.RetryAfter > 0:
			f.remaining, f.t = a.remaining(), out.RetryAfter
		default:
			f.remaining, f.t = a.remaining(), seconds.Ceil(a.Current().ResetAfter)
		}
		return f
	}
	var buf [4]field // most calls carry a few descriptors: no allocation
	fs := buf[:0]
	var top *field // out.Top's when it is one of fs
	for i := range out.Applied {
		a := &out.Applied[i]
		if (a.enforced() && a.Decided) || (a.blocked && a.Rule.Mode != rules.Shadow) {
			fs = append(fs, fieldOf(a))
			if a == out.Top {
				top = &fs[len(fs)-1]
			}
		}
	}
	if top == nil {
		f := fieldOf(out.Top)
		top = &f
	}
	return makeFields(fs, *top, out.Top.plan().quota, out.RetryAfter)
}

// remaining is the whole tokens left in an item's bucket, as the request
// left it (Current), at most math.MaxUint32 (Envoy's limit_remaining).
func (a *Applied) remaining() int64 {
	return int64(uint32(min(a.Current().Remaining, math.MaxUint32)))
}
