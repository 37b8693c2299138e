package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/testserver"
	"github.com/driplimit/drip/storetest"
)

// TestFunctionReload checks that decisions run as a Redis Function, loaded
// on first use and loaded again after FUNCTION FLUSH removed it, with the
// buckets unchanged.
func TestFunctionReload(t *testing.T) {
	r := testserver.StartRedis(t)
	s := open(t, r.URL())
	ctx := context.Background()
	lim := drip.Limit{Rate: 1, Period: time.Hour, Burst: 10}
	take := func(want int64) {
		t.Helper()
		d, err := s.Apply(ctx, drip.OpTake, time.Time{}, drip.Request{Key: "k", Limit: lim, Cost: 1})
		if err != nil || !d.Allowed || d.Remaining != want {
			t.Fatalf("take: %+v, %v; want allowed, %d remaining", d, err, want)
		}
	}
	libs := func() string {
		t.Helper()
		out, err := r.Cli("FUNCTION", "LIST")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if l := libs(); strings.Contains(l, "drip_") {
		t.Fatalf("a fresh server lists %q", l)
	}
	take(9)
	if l := libs(); !strings.Contains(l, "drip_") {
		t.Fatalf("after a take, FUNCTION LIST is %q: no drip library", l)
	}
	if _, err := r.Cli("FUNCTION", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	take(8)
	if l := libs(); !strings.Contains(l, "drip_") {
		t.Fatalf("after a flush and a take, FUNCTION LIST is %q: no drip library", l)
	}
}

// TestScriptsWithoutFunctions runs the conformance suite on a server
// without functions (FCALL and FUNCTION renamed away, as on a server
// before Redis 7): the store falls back to scripts (EVALSHA/EVAL).
func TestScriptsWithoutFunctions(t *testing.T) {
	r := testserver.StartRedis(t, "--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")
	if out, _ := r.Cli("FUNCTION", "LIST"); !strings.Contains(out, "unknown command") {
		t.Fatalf("FUNCTION LIST answered %q", out)
	}
	s := open(t, r.URL())
	storetest.Run(t, func(t *testing.T) drip.Store { return s })
	if out, err := r.Cli("INFO", "commandstats"); err != nil || !strings.Contains(out, "cmdstat_evalsha") {
		t.Fatalf("no EVALSHA in the server's command stats (%v): %s", err, out)
	}
}
