package pace

import (
	"container/list"
	"net/http"
	"time"
)

// entry is what the transport knows of one key's limit. The Transport's
// mutex guards it.
type entry struct {
	key string

	left     int64     // requests left: the fewest reported in this window, or a guess
	limit    int64     // the quota that is back at reset; 0: unknown
	reset    time.Time // when the quota is back; zero: unknown
	until    time.Time // Retry-After: nothing is sent before
	gen      uint64    // counts the guesses of left: an answer to a request sent before the last one is stale
	fresh    bool      // left is a guess: the next report replaces it
	open     bool      // the server sends no rate limit headers: no pacing
	inflight int64     // requests sent and not yet answered: left, less these, may go

	queue   list.List     // the requests waiting, in order
	changed chan struct{} // closed (and replaced) when the state changes
}

func newEntry(key string) *entry {
	return &entry{key: key, left: 1, fresh: true, changed: make(chan struct{})}
}

// ready reports whether a request may be sent at now; if not, at is when to
// look again (zero: when the state changes).
func (e *entry) ready(now time.Time) (at time.Time, ok bool) {
	if now.Before(e.until) {
		return e.until, false
	}
	if !e.until.IsZero() {
		// The server's delay is over: one probe finds out what is left,
		// unless a later reset is known.
		e.until = time.Time{}
		if e.reset.IsZero() || !now.Before(e.reset) {
			e.guess(1)
			e.reset = time.Time{}
		}
	}
	if e.open {
		return time.Time{}, true
	}
	if !e.reset.IsZero() && !now.Before(e.reset) {
		// The quota is back (a single probe when it is unknown); requests
		// still in flight may count against it.
		e.guess(max(e.limit, 1))
		e.reset = time.Time{}
	}
	if e.left <= 0 && e.reset.IsZero() && e.inflight == 0 {
		// Nothing left and no word of when: probe, one at a time.
		e.guess(1)
	}
	if e.left-e.inflight > 0 {
		return time.Time{}, true
	}
	return e.reset, false
}

// guess sets left to n until a report replaces it.
func (e *entry) guess(n int64) {
	e.left, e.fresh = n, true
	e.gen++
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
	rep, ok := parseReport(h, server)
	refused := resp.StatusCode == http.StatusTooManyRequests
	if refused && !hasRA && ok && rep.hasReset {
		ra, hasRA = rep.reset, true
	}
	if hasRA {
		e.until = later(e.until, now.Add(ra))
	}
	retry := hasRA && (refused || resp.StatusCode == http.StatusServiceUnavailable)
	if gen != e.gen {
		// Sent before left was last guessed (at a reset, or after a
		// delay): the server counted it in the old window or the new.
		// Count it in the new one, and learn nothing else from it.
		e.left--
		return retry
	}
	if refused {
		// Nothing is left until the delay the server gave, and then a
		// probe goes first (a token bucket's reset on a 429 is when one
		// request fits, not when the quota is back).
		e.left, e.fresh, e.open, e.reset = 0, false, false, time.Time{}
		if ok && rep.limit > 0 {
			e.limit = rep.limit
		}
		return retry
	}
	if !ok {
		if e.fresh && !hasRA {
			e.open = true // a probe answered without rate limit headers
		}
		return retry
	}
	e.open = false
	var reset time.Time
	if rep.hasReset {
		reset = now.Add(rep.reset)
	}
	// The fewest remaining reported is the latest the server counted: a
	// late answer counted early cannot raise it. Requests in flight are
	// taken from it until they are answered (some the server may have
	// counted already: the client errs on the safe side until then).
	if e.fresh {
		e.left, e.reset, e.fresh = rep.remaining, reset, false
	} else {
		e.left, e.reset = min(e.left, rep.remaining), later(e.reset, reset)
	}
	if rep.limit > 0 {
		e.limit = rep.limit
	}
	return retry
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
