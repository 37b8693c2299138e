package server

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// The decision API on adaptive rules: their slots are learned and held
// in this instance (engine.AcquireSlot), not in the store, so a caller
// holds one as it holds a concurrency limit's slot: /v1/acquire takes
// it (waiting up to "wait" in the rule's queue, by class) under a lease
// ID the server makes, and /v1/release gives it back by that lease. The
// rule learns from the time between (the request's latency, as the
// gateway learns from a response's); a lease not released within the
// rule's lease TTL (30 s) is given back as dropped, which the rule
// learns as a failure (the caller is gone, or its work hung). /v1/peek
// answers the bucket as it is; /v1/take, /v1/refund and a multi-take
// are a 400.

// maxHeldSlots bounds the adaptive slots held through the decision API
// in one instance (each bucket's learned limit bounds them too): past
// it, an acquire is a 503.
const maxHeldSlots = 100_000

// heldSlots are the adaptive slots /v1/acquire handed out, by lease.
type heldSlots struct {
	mu sync.Mutex
	m  map[string]*heldSlot
}

type heldSlot struct {
	rule, key string
	slot      *engine.Slot
	expiry    *time.Timer
}

// add keeps slot under lease until it is released or ttl has passed
// (then it is released as dropped); false when maxHeldSlots are held.
func (h *heldSlots) add(lease, rule, key string, slot *engine.Slot, ttl time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.m) >= maxHeldSlots {
		return false
	}
	if h.m == nil {
		h.m = make(map[string]*heldSlot)
	}
	hs := &heldSlot{rule: rule, key: key, slot: slot}
	hs.expiry = time.AfterFunc(ttl, func() {
		if h.take(lease, rule, key) != nil {
			slot.Release(true)
		}
	})
	h.m[lease] = hs
	return true
}

// take forgets the slot held under lease for rule's bucket key and
// returns it; nil when none is.
func (h *heldSlots) take(lease, rule, key string) *heldSlot {
	h.mu.Lock()
	defer h.mu.Unlock()
	hs, ok := h.m[lease]
	if !ok || hs.rule != rule || hs.key != key {
		return nil
	}
	delete(h.m, lease)
	hs.expiry.Stop()
	return hs
}

// adaptive serves a decision API request by the adaptive rule r, of
// class (rules.ParsePriority; -1: the rule's).
func (s *Server) adaptive(ctx context.Context, opName string, b replay.Raw, r *rules.Rule, class int) (any, error) {
	if opName != "acquire" && opName != "release" && opName != "peek" {
		return nil, inputf("rule %q is adaptive: its slots are held in each instance, taken with /v1/acquire and given back with /v1/release (/v1/peek tells of them), not /v1/%s", r.Name, opName)
	}
	if b.Key != "" || b.Limit != nil {
		return nil, inputf("a request by rule has values instead of key and limit")
	}
	if b.Cost != nil || b.Reserve {
		return nil, inputf("rule %q is adaptive: a request takes one slot, with no cost or reservation", r.Name)
	}
	key, err := ruleKey(r, b.Values, s.rules())
	if err != nil {
		return nil, err
	}
	switch opName {
	case "peek":
		d := s.eng.SlotState(r, key)
		return &d, nil
	case "release":
		if b.Lease == "" {
			return nil, inputf("%v: a release names the lease its acquire returned", store.ErrInvalidLease)
		}
		// A lease as a concurrency limit's: one no acquire could have
		// made is a 400 here too, not a release of nothing.
		if err := store.CheckLease(bucket.Refund, b.Lease, bucket.Params{Kind: bucket.Concurrency}); err != nil {
			return nil, &store.InputError{Err: err}
		}
		if hs := s.slots.take(b.Lease, r.Name, key); hs != nil {
			d := hs.slot.Release(false)
			return &d, nil
		}
		d := s.eng.SlotState(r, key) // not held: changes nothing
		return &d, nil
	}
	if b.Lease != "" {
		return nil, inputf("%v: /v1/acquire names its leases itself; give none", store.ErrInvalidLease)
	}
	if class < 0 {
		class = r.Class()
	}
	wait, maxQueue := min(b.Wait, s.cfg.MaxWait), rules.DefaultMaxQueue
	if r.MaxWait > 0 {
		wait, maxQueue = min(wait, r.MaxWait), r.MaxQueue
	}
	slot, d, shed := s.eng.AcquireSlot(ctx, r, key, class, wait, maxQueue)
	if slot == nil {
		return acquired{d: d, shed: shed}, nil
	}
	lease := store.NewLeaseID()
	if !s.slots.add(lease, r.Name, key, slot, r.Limit.LeaseTTL) {
		slot.Release(false)
		return nil, errorf(http.StatusServiceUnavailable, "%d adaptive slots are held through the decision API: release some", maxHeldSlots)
	}
	return acquired{d: d, lease: lease}, nil
}

// bodyPriority is the class a decision API body names ("priority"), or
// -1 when it names none; one that is not a class is a 400.
func bodyPriority(b replay.Raw) (int, error) {
	if b.Priority == "" {
		return -1, nil
	}
	p, ok := rules.ParsePriority(b.Priority)
	if !ok {
		return 0, inputf("priority: must be critical, default, sheddable, batch or a whole number from 0 to 100 (at most %d bytes)", rules.MaxPriorityValue)
	}
	return p, nil
}

// adaptiveRule is the adaptive rule a request names, if it names one.
func (s *Server) adaptiveRule(it replay.ReqJSON) (*rules.Rule, bool) {
	r, ok := s.rules().Rule(ruleOf(it))
	return r, ok && r.Adaptive != nil
}
