package testserver

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// TestPostgresFailover: a standby replays the primary's writes, and once
// the primary is gone and the standby promoted, it takes writes itself:
// the failover runs of the load harness rely on both.
func TestPostgresFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary := StartPostgres(t)
	standby, err := NewPostgresStandby(primary)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop(); standby.Remove() })
	exec := func(p *Postgres, sql string) error {
		c, err := pgx.Connect(ctx, p.URL())
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, sql)
		return err
	}
	if err := exec(primary, "CREATE TABLE t (v int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := exec(standby, "INSERT INTO t VALUES (2)"); err == nil {
		t.Fatal("the standby took a write")
	}
	for exec(standby, "SELECT 1/count(*) FROM t") != nil { // until the row is replayed
		if ctx.Err() != nil {
			t.Fatal("the standby never replayed the primary's row")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	if err := exec(standby, "INSERT INTO t VALUES (2)"); err != nil {
		t.Fatalf("the promoted standby: %v", err)
	}
}
