package pace

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// answer is a response with status whose GitHub-style headers report
// remaining and a reset at the Unix time reset, as of Date date.
func answer(status, remaining int, date, reset time.Time) *http.Response {
	h := http.Header{}
	h.Set("Date", date.Format(http.TimeFormat))
	h.Set("X-RateLimit-Limit", "10")
	h.Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
	h.Set("X-RateLimit-Reset", strconv.Itoa(int(reset.Unix())))
	return &http.Response{StatusCode: status, Header: h}
}

// send takes a request from e at now, as acquire does, failing the test
// if it may not go, and returns its generation.
func send(t *testing.T, e *entry, now time.Time) uint64 {
	t.Helper()
	if at, ok := e.ready(now); !ok {
		t.Fatalf("at %v: not ready (look again at %v); %+v, in flight %d", now.Sub(t0), at.Sub(t0), e.policies, e.inflight)
	}
	e.inflight++
	return e.gen
}

// mayGo is how many requests may go at now: the least any policy allows
// (one probe when none is known).
func mayGo(e *entry, now time.Time) int64 {
	if _, ok := e.ready(now); !ok {
		return 0
	}
	if !e.known {
		return 1
	}
	n := int64(maxCount)
	for _, p := range e.policies {
		n = min(n, p.left-e.inflight)
	}
	return n
}

// TestEntryOutOfOrder: answers that come back out of order cannot raise
// what is left; answered requests stop counting against it.
func TestEntryOutOfOrder(t *testing.T) {
	e := newEntry("k")
	end := t0.Add(time.Minute)
	e.done(t0, send(t, e, t0), answer(200, 9, t0, end), nil) // the probe
	var gens []uint64
	for range 4 {
		gens = append(gens, send(t, e, t0))
	}
	if n := mayGo(e, t0); n != 5 {
		t.Fatalf("%d may go with 4 of 9 in flight, want 5", n)
	}
	// The server counted them 8, 7, 6, 5; the answers come 6, 8, 5, 7.
	for i, r := range []int{6, 8, 5, 7} {
		e.done(t0, gens[i], answer(200, r, t0, end), nil)
		want := []int64{6 - 3, 6 - 2, 5 - 1, 5}[i]
		if n := mayGo(e, t0); n != want {
			t.Fatalf("after the answer %d: %d may go, want %d", r, n, want)
		}
	}
}

// TestEntryWindow: at the reset the quota is back, less what is in
// flight; the answer to a request sent before it counts against it.
func TestEntryWindow(t *testing.T) {
	e := newEntry("k")
	end := t0.Add(time.Minute)
	e.done(t0, send(t, e, t0), answer(200, 1, t0, end), nil)
	late := send(t, e, t0) // the last one, answered late
	if at, ok := e.ready(t0); ok || !at.Equal(end) {
		t.Fatalf("with nothing left: ready %v at %v, want a wait until the reset", ok, at.Sub(t0))
	}
	if n := mayGo(e, end); n != 9 {
		t.Fatalf("at the reset, one in flight: %d may go, want 10 - 1", n)
	}
	e.done(end, late, answer(200, 0, t0, end), nil) // about the old window, or not: it still counts
	if n := mayGo(e, end); n != 9 {
		t.Fatalf("after the late answer: %d may go, want 9", n)
	}
	e.done(end, send(t, e, end), answer(200, 9, end, end.Add(time.Minute)), nil)
	if n := mayGo(e, end); n != 9 || !e.policies[0].reset.Equal(end.Add(time.Minute)) {
		t.Fatalf("in the new window: %d may go, reset at %v; want 9, 2m", n, e.policies[0].reset.Sub(t0))
	}
}

// TestEntryRefused: a 429 stops everything until its delay; then one
// probe goes first.
func TestEntryRefused(t *testing.T) {
	e := newEntry("k")
	resp := answer(429, 0, t0, t0.Add(time.Hour))
	resp.Header.Set("Retry-After", "30")
	if !e.done(t0, send(t, e, t0), resp, nil) {
		t.Fatal("a 429 with Retry-After: not worth retrying")
	}
	if at, ok := e.ready(t0.Add(29 * time.Second)); ok || !at.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("before Retry-After: ready %v, at %v", ok, at.Sub(t0))
	}
	if n := mayGo(e, t0.Add(30*time.Second)); n != 1 {
		t.Fatalf("after Retry-After: %d may go, want a probe", n)
	}
}
