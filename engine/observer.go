package engine

import (
	"time"

	"github.com/driplimit/drip/rules"
)

// Event is what happened to one rule (or Envoy limit) for one request: the
// one vocabulary of every front door's metrics.
type Event string

const (
	// Allowed: the rule's bucket allowed the request and was taken from.
	Allowed Event = "allowed"
	// Denied: the rule's bucket denied the request.
	Denied Event = "denied"
	// NotTaken: the rule's bucket would have allowed the request, but
	// another rule denied it, so nothing was taken (all or nothing).
	NotTaken Event = "not_taken"
	// ErrorAllowed: the store failed and the rule's on_error let the
	// request through (allow; and every shadow rule).
	ErrorAllowed Event = "error_allowed"
	// ErrorDenied: the store failed and the rule's on_error is deny (503).
	ErrorDenied Event = "error_denied"
	// LocalAllowed and LocalDenied: the store failed and the local
	// fallback decided.
	LocalAllowed Event = "local_allowed"
	LocalDenied  Event = "local_denied"
	// Failed: the store failed and the front door answered with an error
	// (the decision API's 503, the Envoy service's gRPC error).
	Failed Event = "error"
	// Refunded: the bucket was given tokens back (Envoy's negative hits).
	Refunded Event = "refunded"
	// Unlimited: the limit is unlimited; no bucket was asked.
	Unlimited Event = "unlimited"
)

// Observer receives what an engine does, for metrics. Its methods are
// called on the request path and must be fast and safe for concurrent
// use. Embed NopObserver to implement only some of them.
type Observer interface {
	// Decision is called once per request for each rule (or Envoy limit)
	// that applied.
	Decision(rule string, mode rules.Mode, event Event)
	// StoreError is called for each failed store call (not for calls the
	// breaker skipped, nor for bad input).
	StoreError(err error)
	// StoreLatency is called for each store call made.
	StoreLatency(d time.Duration)
	// BreakerState is called when the circuit breaker changes state
	// (BreakerClosed, BreakerOpen, BreakerHalfOpen).
	BreakerState(state string)
	// Tokens is called with the tokens a settlement moved: Charged,
	// Forgiven (past the debt bound, not charged), Refunded, Spent.
	// Settlements are Outcome.Settle and Envoy's Charge items.
	Tokens(rule string, event Event, tokens float64)
}

// KeyObserver hears the bucket key behind each Observer.Decision event,
// with its Item: the key, the limit, and the Decision when Decided. It
// sees keys, which an Observer never does. A program can then tell who
// is limited, and no key becomes a metric label. Its method runs on the
// request path: it must be fast and allocate nothing. It must keep
// nothing the Item points to, except the key string. Set it with
// WithKeys.
type KeyObserver interface {
	Key(rule string, mode rules.Mode, event Event, it *Item)
}

// NopObserver does nothing; embed it to implement part of Observer.
type NopObserver struct{}

func (NopObserver) Decision(string, rules.Mode, Event) {}
func (NopObserver) StoreError(error)                   {}
func (NopObserver) StoreLatency(time.Duration)         {}
func (NopObserver) BreakerState(string)                {}
func (NopObserver) Tokens(string, Event, float64)      {}
