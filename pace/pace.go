// Package pace provides an http.RoundTripper for clients of rate-limited
// APIs: it reads the rate limit headers of every response, waits before sending
// when the server said nothing remains, and retries a request the server
// refused with 429 Too Many Requests after the delay it asked for.
//
//	client := &http.Client{Transport: pace.New(nil)}
//
// # What it reads
//
// From every response, in order of preference:
//
//	RateLimit: "name";r=7;t=2           r = requests remaining, t = seconds until the quota is back
//	RateLimit-Policy: "name";q=20;w=2   q = the quota (what is back at t)
//	RateLimit-Policy: "name";q=3;qu="concurrent-requests"   q = requests in flight at once
//	RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset    (older drafts)
//	X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset   (GitHub and many others)
//	Retry-After: 30 | Retry-After: Wed, 21 Oct 2026 07:28:00 GMT
//
// RateLimit and RateLimit-Policy are structured fields, as drip serve and
// the IETF httpapi ratelimit-headers draft write them: one item per policy
// (a rule that applied), each with its own remaining, reset and quota. The
// transport keeps each policy apart (at most 8 per key) and sends when all
// of them allow it. The single-value headers are one policy, named by
// X-RateLimit-Resource when there is one. A Reset value is a number of seconds from now when it
// is below 100,000,000 (about three years), a Unix time in seconds from
// there, and a Unix time in milliseconds from 100,000,000,000 on;
// fractions are allowed. Unix times and HTTP-dates are measured from the
// response's Date header when it has one, so the client's and the server's
// clocks need not agree (Date is rounded down to the second, so the wait
// errs long, by under a second); without Date, from the client's clock.
//
// # How it paces
//
// State is kept per key: the request's host by default, or what WithKey's
// function returns (an API token, say, when the server limits per token,
// or the path's first segment when its limits differ by path, as GitHub's
// search and core limits do: under one key a request waits for every
// policy the key's answers reported).
// For each key the transport keeps the requests in flight, and for each
// policy the requests left; a request may go while every policy's left
// exceeds the requests in flight:
//
//   - A new key, or one whose state is unknown, gets one request in flight
//     at a time (a probe) until a response reports the limit. A server that
//     sends no rate limit headers is then not paced at all (Retry-After is
//     still obeyed).
//   - Left is the fewest remaining reported in the current window: the
//     server counted that answer's request last, so a late answer from a
//     request it counted early cannot raise it. Requests in flight are
//     taken from it until they are answered, since the server may not have
//     counted them yet (while some it had, the client errs on the safe
//     side).
//   - A policy whose quota unit is "concurrent-requests" (drip's
//     concurrency rules) bounds the requests in flight instead: a
//     request may go while fewer than its q are, and one waits only for an
//     answer to free a slot, never for a reset (such a policy has no
//     window; its r counts the server's free slots, the client's own
//     requests among the holders).
//   - With nothing left, requests wait until the policy's reported reset.
//     Then its left is its quota (q, or the Limit header), or a single
//     probe when the quota is unknown, and requests still in flight count
//     against it: the goroutines that waited do not rush in beyond what the
//     server allows, by that policy or any other.
//     The answer to a request sent before the window opened counts against
//     the new window (the server may have counted it in either), and says
//     nothing else.
//   - A Retry-After (on any response) holds every request to its key until
//     it has passed; then one probe goes first. A 429 is read the same way,
//     with its reset as the delay when it has no Retry-After.
//   - A request that got no answer (a network error) is taken as not
//     counted.
//   - Requests that wait for a key go in the order they came, so none
//     starves behind later ones.
//
// So a client that is alone in using its limit, once it has heard the
// limit, sends no request the server would refuse, from a fixed window (the
// quota is back at the reset) or a token bucket (t is when it is full
// again; between, the client sends in bursts of the quota, which average
// out to the rate, less the rounding of t up to whole seconds). Other
// clients of the same limit can still cause refusals: those are retried
// (below).
//
// A wait is bounded: by the request's context (a deadline the wait would
// pass fails at once), and by WithMaxWait (default DefaultMaxWait). A wait
// beyond either fails at once, without sending, with a *WaitError that is
// ErrWaitTooLong (and context.DeadlineExceeded when the deadline was the
// bound).
//
// # Retries
//
// A response 429 is retried, up to WithRetries times (default
// DefaultRetries), when it says when (Retry-After, or a reset in its rate
// limit headers) and the request can be sent again: it has no body, or a
// GetBody (http.NewRequest sets it for the usual body types). The server
// refused the request, so any method may be retried. A 503 with a
// Retry-After is retried the same way when the request is also idempotent
// (GET, HEAD, OPTIONS, TRACE, PUT, DELETE, or one with an Idempotency-Key
// or X-Idempotency-Key header), since a 503 may come after some work was
// done. A retry whose wait would be too long (as above) is not made: the
// refusal is returned as it is.
//
// State is bounded: at most WithMaxKeys keys (default DefaultMaxKeys) are
// tracked, and the least recently used one with nothing in flight or
// waiting is forgotten first (the least recently used, when all are busy).
package pace

import (
	"bytes"
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Defaults of the options.
const (
	DefaultMaxWait = time.Minute
	DefaultRetries = 3
	DefaultMaxKeys = 1024
)

// ErrWaitTooLong is what a request fails with when it would have to wait
// longer than the transport's MaxWait or its context's deadline allow. It
// was not sent.
var ErrWaitTooLong = errors.New("pace: rate limit wait too long")

// WaitError is the error of a request that was not sent because the wait
// for its key's rate limit was too long. It is ErrWaitTooLong, and
// context.DeadlineExceeded when the request's deadline was the bound.
type WaitError struct {
	Key      string        // the request's key (its host, by default)
	Wait     time.Duration // how long it would have waited
	MaxWait  time.Duration // the bound it would have passed
	Deadline bool          // the bound was the context's deadline
}

func (e *WaitError) Error() string {
	bound := "MaxWait"
	if e.Deadline {
		bound = "the request's deadline"
	}
	return fmt.Sprintf("pace: %s: the rate limit allows the next request in %v, past %s (%v)", e.Key, e.Wait, bound, e.MaxWait)
}

// Is reports whether target is ErrWaitTooLong, or context.DeadlineExceeded
// when the deadline was the bound.
func (e *WaitError) Is(target error) bool {
	return target == ErrWaitTooLong || (e.Deadline && target == context.DeadlineExceeded)
}

// Clock is the time a Transport reads and waits on.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Transport is an http.RoundTripper that paces the requests it sends to
// what the servers' rate limit headers allow (see the package
// documentation). Construct it with New; it is safe for concurrent use.
type Transport struct {
	base    http.RoundTripper
	key     func(*http.Request) string
	clock   Clock
	maxWait time.Duration
	retries int
	maxKeys int

	mu    sync.Mutex
	keys  map[string]*list.Element // of *entry
	order list.List                // most recently used first
}

// Option configures a Transport.
type Option func(*Transport)

// WithKey paces requests per key(req) instead of per host. Requests with
// the same key share one budget; include the host in the key when the
// transport talks to several servers. Keys appear in errors (WaitError):
// hash any secret in them.
func WithKey(key func(*http.Request) string) Option { return func(t *Transport) { t.key = key } }

// WithMaxWait bounds how long a request may wait before it is sent
// (default DefaultMaxWait). Zero or less: never wait; a request that would
// have to fails at once.
func WithMaxWait(d time.Duration) Option { return func(t *Transport) { t.maxWait = max(d, 0) } }

// WithRetries sets how many times a refused request is sent again (default
// DefaultRetries); zero or less: never.
func WithRetries(n int) Option { return func(t *Transport) { t.retries = max(n, 0) } }

// WithMaxKeys bounds the number of keys tracked (default DefaultMaxKeys;
// at least 1).
func WithMaxKeys(n int) Option { return func(t *Transport) { t.maxKeys = max(n, 1) } }

// WithClock reads the time from c and waits on it, instead of the real
// clock.
func WithClock(c Clock) Option { return func(t *Transport) { t.clock = c } }

// New returns a Transport that sends requests through base
// (http.DefaultTransport when nil).
func New(base http.RoundTripper, opts ...Option) *Transport {
	if base == nil {
		base = http.DefaultTransport
	}
	t := &Transport{base: base, key: hostKey, clock: realClock{}, maxWait: DefaultMaxWait,
		retries: DefaultRetries, maxKeys: DefaultMaxKeys, keys: make(map[string]*list.Element)}
	for _, o := range opts {
		o(t)
	}
	return t
}

// hostKey is the default key: the host (and port) the request goes to.
func hostKey(r *http.Request) string { return strings.ToLower(r.URL.Host) }

// RoundTrip waits until the request's key may send, sends req through the
// base transport, and retries a refusal as the package documentation
// describes.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := t.key(req)
	ctx := req.Context()
	e := t.entry(key)
	gen, err := t.acquire(ctx, e)
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	resp, err := t.base.RoundTrip(req)
	retry := t.done(e, gen, resp, err)
	for n := 0; retry && n < t.retries && replayable(req, resp.StatusCode); n++ {
		next, rerr := rewind(req)
		if rerr != nil {
			break
		}
		buffer(resp) // free the connection while waiting: the refusal may still be returned
		gen, werr := t.acquire(ctx, e)
		if werr != nil {
			if ctx.Err() != nil {
				resp.Body.Close()
				return nil, werr
			}
			break // too long a wait: the caller gets the refusal
		}
		resp.Body.Close()
		resp, err = t.base.RoundTrip(next)
		retry = t.done(e, gen, resp, err)
	}
	return resp, err
}

// CloseIdleConnections closes the base transport's idle connections, when
// it has that method.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// replayable reports whether req may be sent again after a refusal with
// status: its body can be read again, and for a 503 it is idempotent.
func replayable(req *http.Request, status int) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	if status == http.StatusTooManyRequests {
		return true
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != ""
}

// rewind returns a copy of req to send again, with a fresh body.
func rewind(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.Body == nil || req.Body == http.NoBody {
		return next, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	next.Body = body
	return next, nil
}

// maxBuffered bounds how much of a refusal's body buffer keeps in memory.
const maxBuffered = 64 << 10

// buffer reads a refusal's body (up to maxBuffered) into memory and closes
// the original, so the connection is free while the retry waits. A longer
// body stays as it was.
func buffer(resp *http.Response) {
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBuffered+1))
	if err != nil || len(b) > maxBuffered {
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(b), resp.Body), resp.Body}
		return
	}
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
}

type readCloser struct {
	io.Reader
	io.Closer
}

// entry returns key's state, creating it (and forgetting a key beyond
// maxKeys) when it is new.
func (t *Transport) entry(key string) *entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.keys[key]; ok {
		t.order.MoveToFront(el)
		return el.Value.(*entry)
	}
	e := newEntry(key)
	t.keys[key] = t.order.PushFront(e)
	if len(t.keys) > t.maxKeys {
		// The least recently used key with nothing in flight or waiting
		// (forgetting a busy one would let its requests and the next ones
		// pace apart), else the least recently used.
		old := t.order.Back()
		for el := old; el != nil && el.Value != e; el = el.Prev() {
			if x := el.Value.(*entry); x.inflight == 0 && x.queue.Len() == 0 {
				old = el
				break
			}
		}
		t.order.Remove(old)
		delete(t.keys, old.Value.(*entry).key)
	}
	return e
}

// acquire waits until e may send, counts one more request in flight, and
// returns the generation of e's state it is sent in. Requests that wait go
// in the order they came (a queue per key), so none starves behind later
// ones.
func (t *Transport) acquire(ctx context.Context, e *entry) (uint64, error) {
	start := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	var me *list.Element // our place in e's queue, once we wait
	leave := func() {
		if me != nil {
			e.queue.Remove(me)
			e.notify() // the next in the queue may go
		}
	}
	for {
		now := t.clock.Now()
		at, ok := e.ready(now)
		if ok && (e.queue.Len() == 0 || e.queue.Front() == me) {
			leave()
			e.inflight++
			return e.gen, nil
		}
		var timer <-chan time.Time
		if !ok { // (when ok, those ahead in the queue go first and wake us)
			left := t.maxWait - now.Sub(start)
			d := left // unknown: until the state changes, at most MaxWait
			if !at.IsZero() {
				d = at.Sub(now)
			}
			werr := &WaitError{Key: e.key, Wait: now.Sub(start) + d, MaxWait: t.maxWait}
			if d > left || (at.IsZero() && left <= 0) {
				leave()
				return 0, werr
			}
			if dl, ok := ctx.Deadline(); ok && !at.IsZero() && at.After(dl) {
				werr.Deadline, werr.MaxWait = true, dl.Sub(start)
				leave()
				return 0, werr
			}
			timer = t.clock.After(d)
		}
		if me == nil {
			me = e.queue.PushBack(nil)
		}
		changed := e.changed
		t.mu.Unlock()
		select {
		case <-changed:
		case <-timer:
		case <-ctx.Done():
			t.mu.Lock()
			leave()
			return 0, ctx.Err()
		}
		t.mu.Lock()
	}
}

// done records what a response (or a failure to get one) said about e's
// limit, and reports whether it is a refusal worth retrying: a 429 or a
// 503 that says when to try again.
func (t *Transport) done(e *entry, gen uint64, resp *http.Response, err error) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return e.done(t.clock.Now(), gen, resp, err)
}
