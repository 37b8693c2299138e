// Package testserver starts throwaway PostgreSQL and Redis servers for
// tests: real server processes on free loopback ports, with data in a
// temporary directory, stopped when the test ends. Tests can kill and
// restart them to test faults.
//
// When a server binary is missing, the test is skipped (and a line on the
// terminal says so, once per test binary and reason, since go test shows
// neither a skip nor a passing package's output without -v), except under
// CI=true, where a missing dependency fails the run.
package testserver

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
)

var missingOnce sync.Map // message -> struct{}: each told once

// Missing reports a missing dependency: a failure under CI=true, a skip
// otherwise. A skip is easy to miss (go test prints "ok" for a package
// whose tests all skipped, and hides what a passing package printed), so
// the first skip of each reason is also written to the terminal
// (/dev/tty), or to standard error where there is none.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and a test dependency is missing: %s", msg)
	}
	if _, told := missingOnce.LoadOrStore(msg, struct{}{}); !told {
		var w io.Writer = os.Stderr
		if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
			defer tty.Close()
			w = tty
		}
		fmt.Fprintf(w, "drip tests: SKIPPING tests that need a missing dependency: %s\n", msg)
	}
	t.Skipf("test dependency missing: %s", msg)
}

// Main runs the tests of a package whose tests use the shared servers
// (SharedPostgres, SharedRedisURL, SharedRedisClusterURL) and stops those
// servers afterwards, so that none outlives the test binary. Call it as
// the whole body of TestMain:
//
//	func TestMain(m *testing.M) { testserver.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	StopShared()
	StopSharedPostgres()
	os.Exit(code)
}

// Prefix is a fresh random key prefix ("drip-test:<12 hex digits>:"), so
// that tests sharing a server, and runs sharing a server named by
// DRIP_TEST_*_URL, keep their keys apart.
func Prefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "drip-test:" + hex.EncodeToString(b[:]) + ":"
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
