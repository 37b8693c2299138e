package batch

import (
	"context"
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
// bound (the reply that came back fastest), renewed at least every
// Refresh so that a server clock stepping back is followed. A deadline
// moved by a lower bound comes, in the server's clock, no later than the
// caller's deadline: the server may refuse a request a little early (by
// about a round trip), never apply one late. The deadlines it is given are
// already short of the callers' own by a margin (SendBy), for the reply to
// travel back before the caller gives up.
type Clock struct {
	mu    sync.Mutex
	known bool
	off   int64     // server - local, ns, a lower bound
	at    time.Time // when off was learned
}

const (
	// Refresh is how long an offset is kept before any newer sample
	// replaces it, even a worse one.
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
	if !k.known || off > k.off || recv.Sub(k.at) > Refresh {
		k.known, k.off, k.at = true, off, recv
	}
	k.mu.Unlock()
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
	off, known := k.off, k.known
	k.mu.Unlock()
	if !known {
		return 0
	}
	return d.UnixNano() + off
}
