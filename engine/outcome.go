package engine

import (
	"context"
	"errors"
	"iter"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/seconds"
	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/rules"
)

// Outcome is the engine's answer on one request: everything a front door
// writes.
type Outcome struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Refused reports a front door's refusal (Refuse): no rule was
	// decided. Detail then says why.
	Refused bool
	items   bool // DecideItems': its fields are itemFields (here: the Outcome stays within 1 KiB)
	// Reason is why the request was denied. Over a limit (HTTP 429), it
	// is the algorithm's reason (ReasonOf) or ReasonCostExceedsBurst. A
	// request shed for its priority class has ReasonShed (429). An
	// adaptive rule at its learned limit gives ReasonOverloaded (503). A
	// failed store under on_error deny gives ReasonStoreUnavailable (503).
	// A refusal has its own (Refuse).
	Reason string
	Detail string
	// Top is the rule the single-value headers describe. On a denial it
	// is the denying rule with the longest wait. Else it is the enforce
	// rule with the least remaining; on a tie, not a concurrency rule. Nil
	// when no enforce rule was decided.
	Top *Applied
	// RetryAfter is the Retry-After value in seconds on a denial. It is
	// the longest wait of the denying rules, rounded up, plus a jitter
	// that Identity seeds (retry_after_jitter). A concurrency rule waits
	// at most ConcurrencyRetryAfter. Zero when the request can never
	// succeed (cost_exceeds_burst).
	RetryAfter int64
	// Identity seeds the jitter: on a denial, Values.Identity of the
	// denying rule's key.
	Identity string
	// Applied lists the rules that applied, enforce rules first, each in
	// file order.
	Applied []Applied
	// Err is the store's error when the store failed, and the fail policy
	// decided. On a refusal it may hold the cause, such as a key
	// function's error. Else nil.
	Err error
	// Shed names the request's priority class when it was denied for it:
	// a prioritized rule kept its rest for higher classes. The name is
	// rules.PriorityName's: critical, default, sheddable, batch or a
	// number. Else empty.
	Shed string

	eng      *Engine
	rs       *Rules
	first    [2]Applied // Applied's backing array for up to two rules: one allocation with the Outcome (TestOutcomeFitsOneKiB)
	released atomic.Bool
	settled  atomic.Bool
	dropped  atomic.Bool // Drop: the upstream did not serve the request well
	// abandoned: Abandon, the caller went away before the request ended
	abandoned atomic.Bool
}

// Learns reports whether the request holds a slot of an adaptive rule,
// whose limit learns from how it ends (Drop, Release): a front door then
// watches its answer.
func (out *Outcome) Learns() bool {
	if out == nil {
		return false
	}
	for i := range out.Applied {
		if out.Applied[i].slot != nil {
			return true
		}
	}
	return false
}

// Drops reports whether status tells of an overloaded upstream for an
// adaptive rule the request holds a slot of (its drop_status).
func (out *Outcome) Drops(status int) bool {
	for i := range out.Applied {
		if a := &out.Applied[i]; a.slot != nil && a.Rule.Adaptive.Drops(status) {
			return true
		}
	}
	return false
}

// Drop tells the adaptive rules that the request was not served well:
// an answer of their drop_status, a timeout, a broken connection. Call
// it before Release, which learns from it.
func (out *Outcome) Drop() {
	if out != nil {
		out.dropped.Store(true)
	}
}

// Abandon tells the adaptive rules that the request's caller went away
// before it ended (a client that hung up): how it ended, and when, tells
// nothing of the upstream, so they learn nothing from it. Call it before
// Release. A hostile client that hangs up at will then cannot teach a
// limit failures, nor latencies it cut short.
func (out *Outcome) Abandon() {
	if out != nil {
		out.abandoned.Store(true)
	}
}

// Refuse returns the outcome of a request a front door refuses before
// deciding any rule. The door cannot read the request as the rules need,
// such as an HTTP path that servers read in different ways. Nothing is
// taken. The door answers with the reason and the detail (HTTP: 400).
func Refuse(reason, detail string) *Outcome {
	return &Outcome{Reason: reason, Refused: true, Detail: detail}
}

// Applied is one rule applied to a request, and what became of it. Its
// Item holds the bucket Key, the Limit (or the local fallback's share of
// it), the Cost, a concurrency rule's Lease and the bucket's Decision.
// The Decision holds when Decided; for a rule not taken, it is the
// bucket as it is.
type Applied struct {
	Item
	Rule *rules.Rule
	// Event is what happened to the rule.
	Event Event
	// Reason is why the rule denied, if it did.
	Reason string
	// Local reports that the local fallback decided, at Limit.
	Local bool

	held bool // the lease was acquired: Release gives it back
	item bool // an item of DecideItems (Current)

	shed  bool      // the rule denied the request for its class
	slot  *adaptive // an adaptive rule's bucket, whose slot the request holds
	since admission // when it took it, with how many in flight
}

// Held reports whether the rule holds a lease of its concurrency limit
// for the request, which Outcome.Release gives back.
func (a *Applied) Held() bool { return a.held }

// Release gives back the slots the request's concurrency rules acquired.
// Call it when the response is over, however it ended (a panic, a client
// gone). It makes one store call through the engine, and one to the
// local fallback if it decided some. The call runs under the rules'
// deadline; ctx's cancellation does not end it. Release does nothing
// without a lease, and acts only once. An error means the store failed;
// the slots then come back when their leases expire (lease_ttl).
func (out *Outcome) Release(ctx context.Context) error {
	if out == nil || out.eng == nil || !out.released.CompareAndSwap(false, true) {
		return nil
	}
	var remote, local []drip.Request
	var plans, lplans []*Plan // remote's, local's
	now := out.eng.clock()
	for i := range out.Applied {
		a := &out.Applied[i]
		a.releaseSlot(now, out.dropped.Load(), !out.abandoned.Load()) // adaptive.go
		if !a.held {
			continue
		}
		r := drip.Request{Key: a.Key, Limit: a.Limit, Lease: a.Lease}
		if a.Local {
			local, lplans = append(local, r), append(lplans, a.plan())
		} else {
			remote, plans = append(remote, r), append(plans, a.plan())
		}
	}
	if len(remote) == 0 && len(local) == 0 {
		return nil // the common case: no concurrency rule, nothing to do
	}
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if len(remote) > 0 {
		_, err := out.eng.applyPlans(ctx, out.rs.timeout, out.rs.breaker, bucket.Refund, remote, plans)
		errs = append(errs, err)
	}
	if len(local) > 0 {
		_, err := applyPlansOn(ctx, out.eng.localStore(), bucket.Refund, out.eng.at(), local, lplans)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (out *Outcome) deny(reason string) {
	if !out.Allowed {
		return
	}
	out.Allowed, out.Reason = false, reason
}

// tighter reports whether decision a describes a tighter limit than b,
// for the single-value headers: on a denied request a longer wait; on an
// allowed one fewer whole tokens left, or as many and longer to fill.
func tighter(a, b drip.Decision, denied bool) bool {
	if denied {
		return a.RetryAfter > b.RetryAfter
	}
	return a.Remaining < b.Remaining || (a.Remaining == b.Remaining && a.ResetAfter > b.ResetAfter)
}

// tighterThan reports whether a, allowed, describes a tighter limit than
// b for the single-value headers (tighter); of a concurrency limit and
// another with as few left, the other, whose reset is a wait to tell of
// (a slot comes back when a request ends).
func (a *Applied) tighterThan(b *Applied) bool {
	if as, bs := a.plan().algo.slots, b.plan().algo.slots; a.Decision.Remaining == b.Decision.Remaining && as != bs {
		return !as
	}
	return tighter(a.Decision, b.Decision, false)
}

// pick chooses the rule the single-value headers describe, the reason,
// the identity and Retry-After.
func (out *Outcome) pick(r Values, jitter rules.Jitter) {
	var top *Applied
	for i := range out.Applied {
		a := &out.Applied[i]
		if a.Rule.Mode == rules.Shadow {
			continue
		}
		if !out.Allowed {
			if a.Reason != "" && (top == nil || a.wait() > top.wait()) {
				top = a
			}
			continue
		}
		if a.Decided && (top == nil || a.tighterThan(top)) {
			top = a
		}
	}
	out.Top = top
	if out.Allowed || top == nil {
		return
	}
	if out.Reason == "" {
		out.Reason = top.Reason
	}
	out.Identity = r.Identity(top.Key)
	if out.Reason != ReasonStoreUnavailable && out.Reason != ReasonCostExceedsBurst {
		var retry time.Duration
		for _, a := range out.Applied {
			if a.Rule.Mode != rules.Shadow && a.Reason != "" {
				retry = max(retry, a.wait())
			}
		}
		out.RetryAfter = jitter.Seconds(out.Identity, retry)
	}
}

// policyItem is the RateLimit-Policy item of plan p of a limit called
// name: q is its quota; for a concurrency limit, qu="concurrent-requests"
// and no window (its slots are held, not spent over a period); for
// others w, the seconds to fill from empty (exact in fixed point: 20 at
// 10/s is 2s), when it has one (a limit that never allows, such as
// Envoy's requests_per_unit 0, has none).
func policyItem(name string, p *Plan) string {
	return policyItemFill(sfv.String(name), p, p.fill)
}

// policyItemFill is policyItem for a plan whose window takes fill to
// fill from empty, with its name as a string item already.
func policyItemFill(name string, p *Plan, fill time.Duration) string {
	s := name + ";q=" + strconv.FormatInt(p.quota, 10)
	if p.algo.slots {
		return s + `;qu="` + sfv.UnitConcurrentRequests + `"`
	}
	if w := seconds.Ceil(fill); w > 0 {
		s += ";w=" + strconv.FormatInt(w, 10)
	}
	return s
}

// policy is the RateLimit-Policy item of the item's plan. A calendar
// window's w is the length of the window the decision fell in (a day of
// 23 or 25 hours, a month of 28 to 31 days), not that of the window the
// plan was compiled in.
func (it *Item) policy() string {
	p := it.plan()
	if !p.dated || it.span <= 0 || time.Duration(it.span) == p.fill {
		return p.policy
	}
	return policyItemFill(p.name, p, time.Duration(it.span))
}

// ConcurrencyRetryAfter is the Retry-After of a concurrency limit's
// denial, before its jitter, unless the earliest lease expires sooner. A
// slot frees when any holder ends, usually soon. Waiting for the earliest
// lease to expire (up to lease_ttl) would be too long.
const ConcurrencyRetryAfter = time.Second

// wait is how long a rule that denied stands for in Retry-After: its
// decision's wait, at most ConcurrencyRetryAfter for a concurrency limit.
func (a *Applied) wait() time.Duration {
	if a.plan().algo.slots {
		return min(a.Decision.RetryAfter, ConcurrencyRetryAfter)
	}
	return a.Decision.RetryAfter
}

// Amount formats a number of tokens for a problem's detail: an integer
// when it is one, else a decimal (at most three decimal places, rounded
// down).
//
// Deprecated: a front door's rendering, not the engine's; it is
// internal/sfv.Number.
func Amount(x float64) string { return sfv.Number(x) }

// ruleField is an applied rule's RateLimit item. A concurrency limit has
// no window: its item has no t, unless it denied (then t is the
// Retry-After value, as for every rule that denied).
func (out *Outcome) ruleField(a *Applied) field {
	f := field{policy: a.policy(), name: a.plan().name, remaining: a.Decision.Remaining}
	switch {
	case !out.Allowed && out.RetryAfter > 0 && a.Reason != "":
		f.t = out.RetryAfter
	case a.plan().algo.slots:
		f.noT = true
	default:
		f.t = seconds.Ceil(a.Decision.ResetAfter)
	}
	return f
}

// field is one decided enforce limit as the RateLimit header lists it:
// its RateLimit-Policy item (policyItem), its name as a structured-field
// string (sfv.String), the whole tokens left (for a concurrency limit,
// the free slots), and t, the seconds until full (on a denial, for the
// limits that denied, the Retry-After value), unless noT: the limit has
// no window to tell of (a concurrency limit that did not deny, a limit
// that never allows), and its item has no t.
type field struct {
	policy, name string
	remaining, t int64
	noT          bool
}

// Fields are the values of the RateLimit headers and Retry-After, every
// one a structured field (RFC 8941):
//
//	RateLimit-Policy: "free";q=20;w=2     every enforce rule decided: q = burst (rounded down), w = seconds to fill from empty
//	RateLimit: "free";r=7;t=2             r = remaining, t = seconds until full (on a 429, for the rules that denied, the Retry-After value)
//	RateLimit-Limit: 20                   the most restrictive rule (least remaining; on a denial the denying one)
//	RateLimit-Remaining: 7
//	RateLimit-Reset: 2
//
// A concurrency limit is a quota of concurrent requests, without a
// window: "slots";q=3;qu="concurrent-requests" in RateLimit-Policy, and
// "slots";r=1 in RateLimit, r the free slots. Its t shows only on a 429
// it caused. Described by the single-value headers, it has no
// RateLimit-Reset unless it denied. Every number is an integer, as the
// ratelimit-headers draft wants. A rule's name is an sf-string of printable ASCII: other
// bytes are written as %xx ("café" is "caf%c3%a9"). Shadow rules never
// show in headers. Policy is empty when no limit was decided. Reset is
// empty when the described limit has no window. RetryAfter is 0 when
// there is no Retry-After.
type Fields struct {
	Policy, RateLimit, Limit, Remaining, Reset string
	RetryAfter                                 int64
}

// The names of the fields, as the HTTP doors' headers (in canonical
// form there), gRPC metadata (in lower case) and Envoy's response carry
// them.
const (
	FieldPolicy     = "RateLimit-Policy"
	FieldRateLimit  = "RateLimit"
	FieldLimit      = "RateLimit-Limit"
	FieldRemaining  = "RateLimit-Remaining"
	FieldReset      = "RateLimit-Reset"
	FieldRetryAfter = "Retry-After"
)

// All yields the fields that have a value, by name. The order is
// RateLimit-Policy, RateLimit, RateLimit-Limit, RateLimit-Remaining,
// RateLimit-Reset, Retry-After. Every front door builds its headers here.
func (f Fields) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		if f.Policy != "" {
			if !yield(FieldPolicy, f.Policy) || !yield(FieldRateLimit, f.RateLimit) ||
				!yield(FieldLimit, f.Limit) || !yield(FieldRemaining, f.Remaining) {
				return
			}
			if f.Reset != "" && !yield(FieldReset, f.Reset) {
				return
			}
		}
		if f.RetryAfter > 0 {
			yield(FieldRetryAfter, strconv.FormatInt(f.RetryAfter, 10))
		}
	}
}

// makeFields builds the header values of the decided limits fs, of which
// top (with quota, its plan's) is the one the single-value headers
// describe.
func makeFields(fs []field, top field, quota int64, retryAfter int64) Fields {
	// One string for all of them, cut into the fields: one allocation,
	// where a string each and a builder each that grows made seven or more.
	n := 3 * 20
	for _, f := range fs {
		n += len(f.policy) + len(f.name) + 2*(len(", ")+20) + len(";r=;t=")
	}
	var b strings.Builder
	b.Grow(n)
	var num [20]byte
	for i, f := range fs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(f.policy)
	}
	policy := b.Len()
	for i, f := range fs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(f.name)
		b.WriteString(";r=")
		b.Write(strconv.AppendInt(num[:0], f.remaining, 10))
		if !f.noT {
			b.WriteString(";t=")
			b.Write(strconv.AppendInt(num[:0], f.t, 10))
		}
	}
	rl := b.Len()
	b.Write(strconv.AppendInt(num[:0], quota, 10))
	limit := b.Len()
	b.Write(strconv.AppendInt(num[:0], top.remaining, 10))
	remaining := b.Len()
	if !top.noT {
		b.Write(strconv.AppendInt(num[:0], top.t, 10))
	}
	all := b.String()
	return Fields{
		Policy:     all[:policy],
		RateLimit:  all[policy:rl],
		Limit:      all[rl:limit],
		Remaining:  all[limit:remaining],
		Reset:      all[remaining:],
		RetryAfter: retryAfter,
	}
}

// Fields returns the values of the RateLimit headers for the enforce rules
// that were decided, and Retry-After on a 429. Policy is empty when no
// rule was decided (none applied, or the store failed and on_error
// allowed).
func (out *Outcome) Fields() Fields {
	if out.items {
		return out.itemFields()
	}
	if out.Top == nil || !out.Top.Decided {
		return Fields{RetryAfter: out.RetryAfter}
	}
	var buf [4]field // most decisions apply a few rules: no allocation
	fs := buf[:0]
	var top field // out.Top's, one of fs
	for i := range out.Applied {
		a := &out.Applied[i]
		if a.Rule.Mode == rules.Shadow || !a.Decided {
			continue
		}
		f := out.ruleField(a)
		if a == out.Top {
			top = f
		}
		fs = append(fs, f)
	}
	return makeFields(fs, top, out.Top.plan().quota, out.RetryAfter)
}
