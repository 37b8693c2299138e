// Package pipenet is an in-memory network for tests that run HTTP servers
// and clients inside a testing/synctest bubble: connections are net.Pipe
// pairs, so every goroutine reading or accepting blocks on channels the
// bubble can see, and virtual time advances whenever they all wait.
// (A real socket would hold the bubble's clock still.)
package pipenet

import (
	"context"
	"errors"
	"net"
	"sync"
)

// Listener is a net.Listener whose connections come from its Dial.
// Create it inside the bubble that uses it.
type Listener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// Listen returns a listener.
func Listen() *Listener {
	return &Listener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept waits for the next Dial.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept and refuses further Dials.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is a placeholder address.
func (l *Listener) Addr() net.Addr { return addr{} }

// Dial connects to the listener; its signature fits
// http.Transport.DialContext (the network and address are ignored).
func (l *Listener) Dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, errors.New("pipenet: listener closed")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type addr struct{}

func (addr) Network() string { return "pipe" }
func (addr) String() string  { return "pipe" }
