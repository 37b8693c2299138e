// Package conncap bounds the connections a listener holds open at once,
// so that a client opening many connections cannot make a server hold
// unbounded memory and goroutines.
package conncap

import (
	"net"
	"sync"
	"sync/atomic"
)

// Listener closes the connections it accepts beyond its cap open at once.
// Closing (rather than leaving them in the accept queue, as a blocking
// limit would) tells a client at once to go elsewhere. A connection's slot
// is given back when it is closed.
type Listener struct {
	net.Listener
	slots chan struct{}
	peak  atomic.Int64
}

// New returns ln with at most max connections open at once (max >= 1).
func New(ln net.Listener, max int) *Listener {
	return &Listener{Listener: ln, slots: make(chan struct{}, max)}
}

// Accept returns the next connection that fits under the cap, closing the
// ones that do not.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			if n := int64(len(l.slots)); n > l.peak.Load() {
				l.peak.Store(n) // Accept runs on one goroutine
			}
			return &slotConn{Conn: c, free: func() { <-l.slots }}, nil
		default:
			c.Close()
		}
	}
}

// Open is how many accepted connections are open now.
func (l *Listener) Open() int { return len(l.slots) }

// Peak is the most accepted connections that were open at once.
func (l *Listener) Peak() int { return int(l.peak.Load()) }

// slotConn gives its slot back when closed, once.
type slotConn struct {
	net.Conn
	once sync.Once
	free func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.free)
	return err
}
