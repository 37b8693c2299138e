package main

import (
	"slices"
	"testing"

	"github.com/driplimit/drip/internal/testkit/testserver"
)

// TestMain stops the PostgreSQL and Redis servers the replay tests share.
func TestMain(m *testing.M) { testserver.Main(m) }

// TestArgsOf: called as /bin/ratelimit, drip is drip serve without the
// decision API.
func TestArgsOf(t *testing.T) {
	if got := argsOf([]string{"/bin/ratelimit"}); !slices.Equal(got, []string{"serve", "--listen", "off"}) {
		t.Fatalf("%q", got)
	}
	if got := argsOf([]string{"/drip", "serve"}); !slices.Equal(got, []string{"serve"}) {
		t.Fatalf("%q", got)
	}
}
