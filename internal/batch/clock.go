package batch

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Clock turns a caller's deadline into the store server's clock, so that
// the server can refuse a request whose deadline passed (one that waited
// in a socket buffer while the server was paused, or on a lock) however
// late it runs it.
//
// It learns the offset between the two clocks from replies: a reply that
// arrived at local time recv and carried the server's time srv (read while
// the server ran the call, so before recv) shows that the server's clock
// is at least srv - recv ahead of ours. Clock keeps the largest such lower
// bound (the reply that came back fastest) of the last one to two Refresh
// periods: a windowed maximum, so that a server clock stepping back is
// followed, and so that no single slow reply (a busy host delays every
// reply it reads) ever becomes the estimate while a better one is recent.
// A deadline moved by a lower bound comes, in the server's clock, no later
// than the caller's deadline: the server may refuse a request a little
// early (by about a round trip), never apply one late. The deadlines it is
// given are already short of the callers' own by a margin (SendBy), for
// the reply to travel back before the caller gives up.
//
// Forget drops what was learned, so that the next call with a deadline
// reads the server's clock afresh: stores call it when a connection
// failed, since the next answer may come from another server (a failover,
// a reconnect through a load balancer) with a clock of its own.
type Clock struct {
	mu     sync.Mutex
	known  bool
	cur    int64     // the best offset (server - local, ns) of the current period
	at     time.Time // when the current period began
	prev   int64     // the best offset of the period before (prevOK: there was one)
	prevOK bool
}

const (
	// Refresh is how long a period of the windowed maximum lasts: the
	// estimate is the best sample of the current period and the one
	// before.
	Refresh = 10 * time.Second
	// MinMargin and MaxMargin bound the margin taken off every deadline
	// sent to a server (see Clock).
	MinMargin = time.Millisecond
	MaxMargin = 100 * time.Millisecond
)

// SendBy is when a store server must have decided a request whose caller
// waits until ctx's deadline (zero: no deadline): that deadline less a
// margin, a fifth of the time left when the caller asked, at least
// MinMargin and at most MaxMargin. A reply slower than the margin (a loaded
// machine) would reach a caller that already gave up, with a decision the
// server applied; a fifth of the budget, fixed when the caller asks (not
// when a queued request is sent, by which time little may be left), makes
// that rare without taking much from the budget (100 ms of a 500 ms store
// deadline, 4 ms of Envoy's 20 ms).
func SendBy(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Time{}
	}
	return d.Add(-min(max(time.Until(d)/5, MinMargin), MaxMargin))
}

// Observe records a reply received at recv carrying the server's clock
// srv, in Unix nanoseconds.
func (k *Clock) Observe(recv time.Time, srv int64) {
	off := srv - recv.UnixNano()
	k.mu.Lock()
	switch {
	case !k.known:
		k.known, k.cur, k.at, k.prevOK = true, off, recv, false
	case recv.Sub(k.at) > Refresh:
		k.prev, k.prevOK = k.cur, recv.Sub(k.at) <= 2*Refresh
		k.cur, k.at = off, recv
	case off > k.cur:
		k.cur = off
	}
	k.mu.Unlock()
}

// offset is the estimate (the caller holds mu).
func (k *Clock) offset() int64 {
	if k.prevOK && k.prev > k.cur {
		return k.prev
	}
	return k.cur
}

// Forget drops every sample: the next call with a deadline reads the
// server's clock first (see Known).
func (k *Clock) Forget() {
	k.mu.Lock()
	k.known, k.prevOK = false, false
	k.mu.Unlock()
}

// ForgetOn forgets (Forget) when err is a failure of the connection or
// the server, not of a deadline: the next answer may come from another
// server, or from the same one after a restart.
func (k *Clock) ForgetOn(err error) {
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		k.Forget()
	}
}

// Known reports whether an offset has been observed.
func (k *Clock) Known() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.known
}

// Deadline is d in the server's clock, Unix nanoseconds; 0 for no
// deadline (d zero, or no offset observed yet: see Known).
func (k *Clock) Deadline(d time.Time) int64 {
	if d.IsZero() {
		return 0
	}
	k.mu.Lock()
	off, known := k.offset(), k.known
	k.mu.Unlock()
	if !known {
		return 0
	}
	return d.UnixNano() + off
}
