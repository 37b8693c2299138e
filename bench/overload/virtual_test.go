package main

import (
	"os"
	"strings"
	"testing"
	"testing/synctest"
)

// TestVirtual runs the benchmark in virtual time (testing/synctest),
// where the upstream's latency, the callers' deadlines and every
// limiter's clock are exact whatever the machine does: what it measures
// is the limiters' learning alone, none of their CPU. It runs only when
// OVERLOAD_VIRTUAL holds the command's flags (or "-" for none):
//
//	OVERLOAD_VIRTUAL='-c 64 -duration 6s' go test ./overload -run Virtual -v -timeout 1h
func TestVirtual(t *testing.T) {
	args := os.Getenv("OVERLOAD_VIRTUAL")
	if args == "" {
		t.Skip("OVERLOAD_VIRTUAL is not set")
	}
	if args == "-" {
		args = ""
	}
	o, err := parse(strings.Fields(args))
	if err != nil {
		t.Fatal(err)
	}
	o.virtual = true
	synctest.Test(t, func(t *testing.T) { measure(o) })
}
