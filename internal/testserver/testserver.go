// Package testserver starts throwaway PostgreSQL and Redis servers for
// tests: real server processes on free loopback ports, with data in a
// temporary directory, stopped when the test ends. Tests can kill and
// restart them to test faults.
//
// When a server binary is missing, the test is skipped, except under
// CI=true, where a missing dependency fails the run.
package testserver

import (
	"net"
	"os"
	"testing"
)

// Missing reports a missing dependency: a failure under CI=true, a skip
// otherwise.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and a test dependency is missing: "+format, args...)
	}
	t.Skipf("test dependency missing: "+format, args...)
}

// FreePort returns a loopback TCP port that was free a moment ago, at most
// max (0: no bound; Redis Cluster needs port+10000 to be a port too).
func FreePort(t testing.TB, max int) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if max == 0 || port <= max {
			return port
		}
	}
	t.Fatalf("no free port at most %d", max)
	return 0
}
