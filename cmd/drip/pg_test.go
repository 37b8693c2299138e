package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/storetest"
)

// TestReplayPostgres installs the schema with drip pg install (twice: it is
// idempotent), then runs drip replay --store postgres://... on every trace
// of storetest and wants the memory store's output, line for line: on a
// direct connection, and through PgBouncer in transaction mode with the
// same plain URL.
func TestReplayPostgres(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	for name, url := range map[string]string{
		"direct":    pg.URL(),
		"pgbouncer": testserver.StartPgBouncer(t, pg, 0).URL(),
	} {
		t.Run(name, func(t *testing.T) { replayPostgres(t, url) })
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"pg", "install"}, nil, &out, &errb); code != 2 {
		t.Errorf("drip pg install without --url: exit %d, want 2", code)
	}
}

func replayPostgres(t *testing.T, url string) {
	ctx := context.Background()
	for range 2 {
		var out, errb bytes.Buffer
		if code := run(ctx, []string{"pg", "install", "--url", url}, nil, &out, &errb); code != 0 {
			t.Fatalf("drip pg install: exit %d: %s", code, errb.String())
		}
	}
	// --unlogged and --logged say what they made.
	for flag, want := range map[string]string{"--unlogged": "drip.buckets and drip.leases are UNLOGGED tables", "--logged": "drip.buckets and drip.leases are logged tables"} {
		var out, errb bytes.Buffer
		if code := run(ctx, []string{"pg", "install", "--url", url, flag}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), want) {
			t.Fatalf("drip pg install %s: exit %d: %s%s, want %q", flag, code, out.String(), errb.String(), want)
		}
	}
	replay := func(store string, in []string) []string {
		var out, errb bytes.Buffer
		code := run(ctx, []string{"replay", "--store", store}, strings.NewReader(strings.Join(in, "\n")), &out, &errb)
		if code != 0 {
			t.Fatalf("replay --store %s: exit %d: %s", store, code, errb.String())
		}
		return strings.Split(strings.TrimSpace(out.String()), "\n")
	}
	for _, name := range storetest.TraceNames() {
		in, _ := storetest.ReadTrace(name)
		want := replay("memory", in)
		got := replay(url, in)
		if len(got) != len(want) {
			t.Fatalf("%s: %d lines, want %d", name, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%s line %d:\n postgres %s\n memory   %s", name, i+1, got[i], want[i])
			}
		}
	}
}
