package pace

import (
	"container/list"
	"net/http"
	"time"
)

// entry is what the transport knows of one key's limits. The Transport's
// mutex guards it.
type entry struct {
	key string

	known    bool          // policies hold what the server reported; else one probe at a time
	policies []policy      // at most maxPolicies
	until    time.Time     // Retry-After: nothing is sent before
	open     bool          // the server sends no rate limit headers: no pacing
	inflight int64         // requests sent and not yet answered
	gen      uint64        // counts the guesses: an answer to a request sent before the last one is stale
	queue    list.List     // the requests waiting, in order
	changed  chan struct{} // closed (and replaced) when the state changes
}

// policy is one of the server's limits on a key, as reported. A request
// may go while every policy's left exceeds the requests in flight.
type policy struct {
	name  string
	left  int64     // the fewest remaining reported in this window, or the quota at a reset
	limit int64     // the quota that is back at reset; 0: unknown
	reset time.Time // when the quota is back; zero: unknown
	fresh bool      // left is the quota guessed at a reset: the next report replaces it
	// concurrent: a quota of requests in flight at once (limit of them),
	// not of requests per window: a request may go while fewer than limit
	// are in flight, whatever left and reset say; a slot frees when an
	// answer comes.
	concurrent bool
}

// allows reports whether p lets one more request go with inflight
// requests in flight.
func (p *policy) allows(inflight int64) bool {
	if p.concurrent {
		return inflight < p.limit
	}
	return p.left-inflight > 0
}

func newEntry(key string) *entry {
	return &entry{key: key, changed: make(chan struct{})}
}

// forget drops what the server reported: one probe goes next.
func (e *entry) forget() {
	e.known, e.policies = false, e.policies[:0]
	e.gen++
}

// ready reports whether a request may be sent at now; if not, at is when to
// look again (zero: when the state changes).
func (e *entry) ready(now time.Time) (at time.Time, ok bool) {
	if now.Before(e.until) {
		return e.until, false
	}
	if !e.until.IsZero() {
		e.until = time.Time{} // the server's delay is over: a probe finds out what is left
		e.forget()
	}
	if e.open {
		return time.Time{}, true
	}
	probe := !e.known
	for i := range e.policies {
		p := &e.policies[i]
		if p.concurrent || p.reset.IsZero() || now.Before(p.reset) {
			continue
		}
		if p.limit == 0 {
			probe = true // back, but to what is unknown
			break
		}
		// The quota is back; requests still in flight may count against it.
		p.left, p.fresh, p.reset = p.limit, true, time.Time{}
		e.gen++
	}
	if probe {
		if e.known {
			e.forget()
		}
		return time.Time{}, e.inflight == 0
	}
	blocked, noReset := false, false
	for _, p := range e.policies {
		if p.allows(e.inflight) {
			continue
		}
		blocked = true
		if p.concurrent {
			continue // until an answer frees a slot (e.inflight > 0: the limit is)
		}
		if p.reset.IsZero() {
			noReset = true
		} else if at.IsZero() || p.reset.Before(at) {
			at = p.reset
		}
	}
	if !blocked {
		return time.Time{}, true
	}
	if noReset && e.inflight == 0 {
		// Nothing left and no word of when: probe, one at a time.
		e.forget()
		return time.Time{}, true
	}
	return at, false
}

// done records the answer at now to one request sent for e in generation
// gen, and reports whether it is a refusal worth retrying: a 429 or a 503
// that says when to try again.
func (e *entry) done(now time.Time, gen uint64, resp *http.Response, err error) bool {
	e.inflight--
	defer e.notify()
	if err != nil {
		return false // no answer: assume the server did not count it
	}
	h := resp.Header
	server := serverNow(h, now)
	ra, hasRA := retryAfter(h, server)
	reps := parseReport(h, server)
	refused := resp.StatusCode == http.StatusTooManyRequests
	if refused && !hasRA {
		for _, r := range reps {
			if r.hasReset && r.remaining == 0 && r.reset > ra {
				ra, hasRA = r.reset, true
			}
		}
	}
	if hasRA {
		e.until = later(e.until, now.Add(ra))
	}
	retry := hasRA && (refused || resp.StatusCode == http.StatusServiceUnavailable)
	if gen != e.gen {
		// Sent before the last guess (a reset, a probe): the server
		// counted it in the old window or the new. Count it in the new
		// one, and learn nothing else from it.
		for i := range e.policies {
			e.policies[i].left--
		}
		return retry
	}
	if refused {
		// Nothing is left until the delay the server gave, and then a
		// probe goes first (a token bucket's reset on a 429 is when one
		// request fits, not when the quota is back).
		e.open = false
		e.forget()
		return retry
	}
	if len(reps) == 0 {
		if !e.known && !hasRA {
			e.open = true // a probe answered without rate limit headers
		}
		return retry
	}
	e.open = false
	if !e.known {
		e.known, e.policies = true, e.policies[:0]
	}
	for _, r := range reps {
		e.record(now, r)
	}
	return retry
}

// record takes one policy's report into e. The fewest remaining reported
// is the latest the server counted: a late answer counted early cannot
// raise it. Requests in flight are taken from it until they are answered
// (some the server may have counted already: the client errs on the safe
// side until then).
func (e *entry) record(now time.Time, r report) {
	var reset time.Time
	if r.hasReset {
		reset = now.Add(r.reset)
	}
	var p *policy
	for i := range e.policies {
		if e.policies[i].name == r.name {
			p = &e.policies[i]
		}
	}
	switch {
	case p == nil && len(e.policies) == maxPolicies:
		return
	case p == nil:
		e.policies = append(e.policies, policy{name: r.name, left: r.remaining, reset: reset})
		p = &e.policies[len(e.policies)-1]
	case r.concurrent || p.concurrent:
		p.left, p.reset = r.remaining, reset
	case p.fresh:
		p.left, p.reset, p.fresh = r.remaining, reset, false
	default:
		p.left, p.reset = min(p.left, r.remaining), later(p.reset, reset)
	}
	if r.limit > 0 {
		p.limit = r.limit
	}
	p.concurrent = r.concurrent && p.limit > 0
}

// notify wakes the requests waiting on e.
func (e *entry) notify() {
	close(e.changed)
	e.changed = make(chan struct{})
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
