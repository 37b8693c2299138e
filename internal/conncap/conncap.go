// Package conncap bounds the connections a listener holds open at once,
// so that a client opening many connections cannot make a server hold
// unbounded memory and goroutines.
package conncap

import (
	"container/list"
	"context"
	"net"
	"sync"
)

// Listener closes the connections it accepts beyond its cap open at once.
// Closing (rather than leaving them in the accept queue, as a blocking
// limit would) tells a client at once to go elsewhere. A connection's slot
// is given back when it is closed.
//
// With Evict, a connection accepted at the cap first makes room by
// closing the oldest open connection that is not serving a request (one
// still sending its headers, or idle between requests; see Busy): else a
// client that opens the cap's worth of connections and sends nothing, or
// sends its headers a byte at a time, would shut every other client out
// until the header deadline, and again as soon as it reconnects.
type Listener struct {
	net.Listener
	max   int
	evict bool

	mu   sync.Mutex
	open list.List // of *slotConn, oldest first
	peak int
}

// New returns ln with at most max connections open at once (max >= 1).
func New(ln net.Listener, max int) *Listener {
	return &Listener{Listener: ln, max: max}
}

// Evict makes l, at its cap, close the oldest connection not serving a
// request rather than the one just accepted. It is for HTTP servers that
// mark what they serve with Busy; it returns l.
func (l *Listener) Evict() *Listener {
	l.evict = true
	return l
}

// Accept returns the next connection that fits under the cap, closing the
// ones that do not.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if sc, victim := l.admit(c); sc != nil {
			if victim != nil {
				victim.Conn.Close()
			}
			return sc, nil
		}
		c.Close()
	}
}

// admit takes a slot for c, at the cap one freed from the victim it
// returns (to be closed), or returns nil when there is none.
func (l *Listener) admit(c net.Conn) (sc, victim *slotConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open.Len() >= l.max {
		if !l.evict {
			return nil, nil
		}
		for e := l.open.Front(); e != nil; e = e.Next() {
			if v := e.Value.(*slotConn); v.busy == 0 {
				victim = v
				break
			}
		}
		if victim == nil {
			return nil, nil
		}
		l.open.Remove(victim.elem)
		victim.elem = nil
	}
	sc = &slotConn{Conn: c, l: l}
	sc.elem = l.open.PushBack(sc)
	l.peak = max(l.peak, l.open.Len())
	return sc, victim
}

// Open is how many accepted connections are open now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open.Len()
}

// Peak is the most accepted connections that were open at once.
func (l *Listener) Peak() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.peak
}

// slotConn gives its slot back when closed, once.
type slotConn struct {
	net.Conn
	l    *Listener
	elem *list.Element // in l.open; nil once the slot is given back
	busy int           // requests being served on it, under l.mu
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	if c.elem != nil {
		c.l.open.Remove(c.elem)
		c.elem = nil
	}
	c.l.mu.Unlock()
	return err
}

type connKey struct{}

// WithConn is for http.Server.ConnContext: it keeps c in the context of
// the requests served on it, for Busy.
func WithConn(ctx context.Context, c net.Conn) context.Context {
	if sc, ok := c.(*slotConn); ok {
		return context.WithValue(ctx, connKey{}, sc)
	}
	return ctx
}

// Busy marks the connection of ctx (see WithConn) as serving a request,
// so that an evicting Listener leaves it open, until the returned func
// is called.
func Busy(ctx context.Context) (done func()) {
	sc, _ := ctx.Value(connKey{}).(*slotConn)
	if sc == nil {
		return func() {}
	}
	sc.l.mu.Lock()
	sc.busy++
	sc.l.mu.Unlock()
	return func() {
		sc.l.mu.Lock()
		sc.busy--
		sc.l.mu.Unlock()
	}
}
