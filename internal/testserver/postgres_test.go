package testserver

import (
	"net"
	"strconv"
	"testing"
)

// TestPostgresLifecycle starts a server, stops it, and starts it again on
// the same port: the fault tests of the stores rely on all three.
func TestPostgresLifecycle(t *testing.T) {
	p := StartPostgres(t)
	dial := func() error {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port())))
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(); err != nil {
		t.Fatalf("server not listening: %v", err)
	}
	if !p.ready() {
		t.Fatal("server not ready")
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := dial(); err == nil {
		t.Fatal("server still listening after Kill")
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if !p.ready() {
		t.Fatal("server not ready after restart")
	}
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	if !p.ready() {
		t.Fatal("server not ready after Restart")
	}
}
