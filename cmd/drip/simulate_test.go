package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func simulateCmd(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), append([]string{"simulate"}, args...), strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestSimulateCommand(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "out.svg")
	code, out, errOut := simulateCmd(t, "", "--rate", "10", "--burst", "50", "--rps", "60", "--for", "10s", "--svg", svg, "--requests", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"limit           10/1s burst 50\n",
		"traffic         60/s for 10s\n",
		"requests        600 over 10s, 1 key\n",
		"accepted        149 (24.8%), 14.9/s\n",
		"first denial    request 60 at 0.983s: 0.83 tokens left, retry after 0.017s (Retry-After: 1)\n",
		"steady state    16.7% accepted, 10.0/s (from 5s to the end at 10s)\n",
		"     2     0.017s         48.17  accepted\n",
		"0-1                 60        59        1      98.3%  1.00\n",
		"9-10                60        10       50      16.7%  1.00\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("chart is not well-formed: %v", err)
		}
	}
}

func TestSimulateWorkedExampleInterval(t *testing.T) {
	code, out, errOut := simulateCmd(t, "", "--rate", "10", "--burst", "50", "--refill", "interval", "--pattern", "60/s for 10s, idle 5s, 60/s for 1s")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"first denial    request 51 at 0.833s: 0.00 tokens left, retry after 0.167s (Retry-After: 1)",
		"0-1                 60        50       10      83.3%  10.00",
		"14-15                0         0        0          -  50.00",
		"15-16               60        50       10      83.3%  10.00",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestSimulateInputs(t *testing.T) {
	trace := `{"at": 0, "key": "a", "limit": {"rate": 1, "burst": 1}}
{"at": 0.5, "key": "a", "limit": {"rate": 1, "burst": 1}}
`
	code, out, errOut := simulateCmd(t, trace, "--trace", "-")
	if code != 0 || !strings.Contains(out, "first denial    request 2 at 0.500s") {
		t.Errorf("trace with its own limits: exit %d, %s%s", code, out, errOut)
	}
	// The command's limit replaces the trace's.
	code, out, errOut = simulateCmd(t, trace, "--trace", "-", "--rate", "5")
	if code != 0 || !strings.Contains(out, "first denial    none") {
		t.Errorf("trace with --rate: exit %d, %s%s", code, out, errOut)
	}

	log := `10.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1
10.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1
10.0.0.2 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1
`
	code, out, errOut = simulateCmd(t, log, "--log", "-", "--key-field", "1", "--rate", "1")
	if code != 0 || !strings.Contains(out, "3 over 1s, 2 keys") || !strings.Contains(out, `first denial    request 2 at 0.000s (key "10.0.0.1")`) {
		t.Errorf("log: exit %d, %s%s", code, out, errOut)
	}
}

func TestSimulateUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rate", "10"}, "give one traffic source"},
		{[]string{"--rate", "10", "--rps", "5", "--pattern", "idle 1s"}, "give one traffic source"},
		{[]string{"--rps", "5"}, "give a limit"},
		{[]string{"--rate", "-1", "--rps", "5"}, "rate must be > 0"},
		{[]string{"--rate", "10", "--pattern", "lots"}, `phase 1 "lots"`},
		{[]string{"--rate", "10", "--rps", "5", "--cost", "11"}, "cost exceeds burst"},
		{[]string{"--rate", "10", "--period", "soon", "--rps", "5"}, "invalid value"},
	} {
		code, _, errOut := simulateCmd(t, "", c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, stderr %q, want %q", c.args, code, errOut, c.want)
		}
	}
}

func TestSimulateRules(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.json")
	err := os.WriteFile(file, []byte(`{"rules": [
  {"name": "free", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
   "algorithm_config": {"rps": 10, "burst": 50}},
  {"name": "heavy", "limit_keys": ["ip:address"], "mode": "shadow", "algorithm": "token_bucket",
   "algorithm_config": {"rps": 10, "burst": 50, "fixed_cost": 2}}
]}`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	// The rule's limit gives the same figures as the flags.
	code, out, errOut := simulateCmd(t, "", "--rules", file, "--rule", "free", "--rps", "60")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		`rule            "free" of ` + file + "\n",
		"limit           10/1s burst 50\n",
		"first denial    request 60 at 0.983s",
		"steady state    16.7% accepted, 10.0/s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The rule's fixed cost applies: 2 tokens a request, 5 per second.
	code, out, errOut = simulateCmd(t, "", "--rules", file, "--rule", "heavy", "--rps", "60")
	if code != 0 || !strings.Contains(out, "(shadow: it never blocks") || !strings.Contains(out, "steady state    8.3% accepted, 5.0/s") {
		t.Errorf("heavy: exit %d: %s%s", code, out, errOut)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rules", file, "--rps", "1"}, `has 2 rules: choose one with --rule ("free", "heavy")`},
		{[]string{"--rules", file, "--rule", "paid", "--rps", "1"}, `has no rule "paid"`},
		{[]string{"--rules", file, "--rule", "free", "--rate", "5", "--rps", "1"}, "--rate and --rules"},
		{[]string{"--rule", "free", "--rps", "1"}, "--rule needs --rules FILE"},
		{[]string{"--rules", filepath.Join(dir, "none.json"), "--rps", "1"}, "no such file"},
	} {
		code, _, errOut := simulateCmd(t, "", c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, stderr %q, want %q", c.args, code, errOut, c.want)
		}
	}
}

// TestSimulateSlidingWindow: 10 per 10s in 5 slots of 2s. The 10 taken
// at 0 count in slot 0, which every window counts until slot 6 begins at
// 12s (one slot past the 10s window: what a slot costs), so the requests
// of 5s to 11s are denied and those of 12s on are allowed.
func TestSimulateSlidingWindow(t *testing.T) {
	code, out, errOut := simulateCmd(t, "", "--algorithm", "sliding_window", "--rate", "10", "--period", "10s", "--slots", "5", "--pattern", "10 at once, idle 5s, 1/s for 12s")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"limit           sliding_window 10/10s burst 10 slots 5\n",
		"accepted        15 (68.2%), 0.9/s\n",
		"first denial    request 11 at 5.000s: 0.00 tokens left, retry after 7.000s (Retry-After: 7)\n",
		"11-12                1         0        1       0.0%",
		"12-13                1         1        0     100.0%  9.00\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestSimulateCalendarDay: 3 per calendar day in Berlin, one request an
// hour from 20:00 CET on 28 March 2026. The 28th ends 4 hours in; the
// 29th, when clocks go from 02:00 to 03:00, is 23 hours long and ends at
// 27h (midnight CEST); the 30th ends 24 hours later, at 51h.
func TestSimulateCalendarDay(t *testing.T) {
	code, out, errOut := simulateCmd(t, "", "--algorithm", "fixed_window", "--calendar", "day", "--time-zone", "Europe/Berlin", "--rate", "3",
		"--from", "2026-03-28T20:00:00+01:00", "--pattern", "1/h for 52h", "--step", "1h")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"limit           fixed_window 3/day Europe/Berlin burst 3\n",
		"windows         calendar days in Europe/Berlin, from local midnight (daylight saving time included)\n",
		"accepted        10 (19.2%)",
		"first denial    request 4 at 10800.000s: 0.00 tokens left, retry after 3600.000s (Retry-After: 3600)\n",
		"10800-14400          1         0        1       0.0%  3.00\n",
		"14400-18000          1         1        0     100.0%  2.00\n",
		"93600-97200          1         0        1       0.0%  3.00\n",
		"97200-100800         1         1        0     100.0%  2.00\n",
		"180000-183600        1         0        1       0.0%  3.00\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
