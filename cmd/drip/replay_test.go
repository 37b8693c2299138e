package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/driplimit/drip/storetest"
)

// TestReplayGolden runs drip replay (the command, in process) on every
// trace of storetest and compares with the golden output.
func TestReplayGolden(t *testing.T) {
	for _, name := range storetest.TraceNames() {
		in, golden := storetest.ReadTrace(name)
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"replay", "--store", "memory"}, strings.NewReader(strings.Join(in, "\n")), &out, &errb)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, errb.String())
		}
		got := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(got) != len(golden) {
			t.Fatalf("%s: %d lines, want %d", name, len(got), len(golden))
		}
		for i := range got {
			if !storetest.SameLine(got[i], golden[i]) {
				t.Errorf("%s line %d:\n got  %s\n want %s", name, i+1, got[i], golden[i])
			}
		}
	}
}

func TestUnknownCommandAndVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"frobnicate"}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unknown command") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"version"}, nil, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "drip ") {
		t.Fatalf("version: exit %d, %q", code, out.String())
	}
	if code := run(context.Background(), []string{"replay", "--store", "carrier-pigeon://x"}, strings.NewReader(""), &out, &errb); code == 0 {
		t.Fatal("an unknown store must fail")
	}
}
