package main

import (
	"bytes"
	"context"
	"net"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// runCmd runs "drip args..." and returns its exit code and outputs.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(t.Context(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// TestHelp: every subcommand explains itself on stdout with exit 0: a
// synopsis, what it does, examples, and its flags.
func TestHelp(t *testing.T) {
	for _, c := range []struct {
		args  []string
		wants []string
	}{
		{[]string{"--help"}, []string{"usage: drip <command>", "serve", "replay", "simulate", "check", "pg", "version"}},
		{[]string{"-h"}, []string{"usage: drip <command>"}},
		{[]string{"help"}, []string{"usage: drip <command>"}},
		{[]string{"help", "serve"}, []string{"usage: drip serve", "-store-timeout"}},
		{[]string{"serve", "--help"}, []string{"usage: drip serve", "Examples:", "drip serve --rules examples/rules.json", "flags:", "-listen", "DRIP_LISTEN", "-admin-token"}},
		{[]string{"serve", "-h"}, []string{"usage: drip serve", "QUOTA_MODE", "RESPONSE_DYNAMIC_METADATA", "LIMIT_RESPONSE_HEADERS_ENABLED", "LIMIT_RESET_HEADER", "GRPC_PORT", "memory, Redis and PostgreSQL\nstores hold them"}},
		{[]string{"replay", "-h"}, []string{"usage: drip replay", "Examples:", "flags:", "-store", "-prefix"}},
		{[]string{"simulate", "-h"}, []string{"usage: drip simulate", "Examples:", "flags:", "-rate", "-svg"}},
		{[]string{"check", "-h"}, []string{"usage: drip check PATH...", "envoyproxy/ratelimit", "directory", "MERGE_DOMAIN_CONFIG", "Examples:"}},
		{[]string{"check", "--help"}, []string{"usage: drip check"}},
		{[]string{"pg", "-h"}, []string{"usage: drip pg install", "Examples:", "drip_install=true", "flags:", "-url"}},
		{[]string{"pg", "install", "-h"}, []string{"usage: drip pg install", "Examples:", "flags:", "-unlogged", "-url"}},
		{[]string{"version", "-h"}, []string{"usage: drip version"}},
	} {
		code, out, errOut := runCmd(t, c.args...)
		if code != 0 || errOut != "" {
			t.Errorf("drip %q: exit %d, stderr %q; want 0 and nothing on stderr", c.args, code, errOut)
		}
		for _, w := range c.wants {
			if !strings.Contains(out, w) {
				t.Errorf("drip %q: stdout lacks %q:\n%s", c.args, w, out)
			}
		}
	}
	// Without a command, the usage goes to stderr with exit 2.
	if code, out, errOut := runCmd(t); code != 2 || out != "" || !strings.Contains(errOut, "usage: drip") {
		t.Errorf("drip: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestBadFlagIsOneLine: a bad flag or flag value is one line saying what
// is wrong and a pointer to -h, not the whole usage.
func TestBadFlagIsOneLine(t *testing.T) {
	for _, args := range [][]string{
		{"simulate", "--rate", "ten", "--rps", "5"},
		{"simulate", "--period", "soon"},
		{"serve", "--bogus"},
		{"serve", "--store-timeout", "x"},
		{"replay", "--nope"},
		{"check", "--nope"},
		{"pg", "install", "--unlogged=maybe"},
	} {
		code, out, errOut := runCmd(t, args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 2 || out != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], "drip "+args[0]) || !strings.Contains(lines[1], "-h' for usage") {
			t.Errorf("drip %q: exit %d, stdout %q, stderr:\n%s\nwant exit 2 and two lines: the problem and a pointer to -h", args, code, out, errOut)
		}
	}
}

func TestVersionLine(t *testing.T) {
	rev := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}}
	for _, c := range []struct {
		info     *debug.BuildInfo
		override string
		want     string
	}{
		{nil, "", "drip (devel)"},
		{&debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "", "drip v1.2.3"},
		{&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: rev}, "", "drip (devel) rev 0123456789ab"},
		{&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: append(rev, debug.BuildSetting{Key: "vcs.modified", Value: "true"})}, "", "drip (devel) rev 0123456789ab (modified)"},
		{&debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "v9.9.9-rc1", "drip v9.9.9-rc1"},
	} {
		if got := versionLine(c.info, c.override); got != c.want {
			t.Errorf("versionLine(%+v, %q) = %q, want %q", c.info, c.override, got, c.want)
		}
	}
	// The command prints the test binary's own build info.
	info, _ := debug.ReadBuildInfo()
	code, out, _ := runCmd(t, "version")
	if code != 0 || out != versionLine(info, "")+"\n" {
		t.Errorf("drip version: exit %d, %q", code, out)
	}
}

// TestNoSecretShown: a store URL's password never appears in what drip
// prints, whether the store opens (the banner) or fails (the error).
func TestNoSecretShown(t *testing.T) {
	for _, args := range [][]string{
		{"replay", "--store", "postgres://drip:s3cret@127.0.0.1:badport/app"},
		{"replay", "--store", "redis://default:s3cret@127.0.0.1:1/0?dial_timeout=100ms"},
		{"replay", "--store", "carrier-pigeon://drip:s3cret@coop"},
		{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--store", "postgres://drip:s3cret@127.0.0.1:badport/app?password=s3cret"},
		{"pg", "install", "--url", "redis://drip:s3cret@127.0.0.1:1"},
		{"pg", "install", "--url", "postgres://drip:s3cret@127.0.0.1:badport/app"},
	} {
		code, out, errOut := runCmd(t, args...)
		if code == 0 || strings.Contains(out+errOut, "s3cret") {
			t.Errorf("drip %q: exit %d, output %q %q: want a failure that shows no password", args, code, out, errOut)
		}
	}
	// The banner of a store that opens.
	ctx, cancel := context.WithCancel(t.Context())
	var out, errs lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--drain=0", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--store", "memory://drip:s3cret@local"}, strings.NewReader(""), &out, &errs)
	}()
	deadline := time.Now().Add(time.Minute) // generous: how long start-up takes is not what this tests
	for !strings.Contains(out.String(), "decision API on") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if banner := out.String(); !strings.Contains(banner, "store memory://drip:xxxxx@local") || strings.Contains(banner+errs.String(), "s3cret") {
		t.Errorf("banner %q, stderr %q: want the store with its password hidden", banner, errs.String())
	}
}

func TestPGInstallWantsPostgres(t *testing.T) {
	code, _, errOut := runCmd(t, "pg", "install", "--url", "redis://localhost:6379")
	if code != 2 || !strings.Contains(errOut, "not a PostgreSQL URL: want postgres://") {
		t.Errorf("exit %d, %q", code, errOut)
	}
	code, _, errOut = runCmd(t, "pg", "install", "--url", "postgres://x@h/db", "--logged", "--unlogged")
	if code != 2 || !strings.Contains(errOut, "choose one") {
		t.Errorf("exit %d, %q", code, errOut)
	}
	code, _, errOut = runCmd(t, "pg", "uninstall")
	if code != 2 || !strings.Contains(errOut, `unknown subcommand "uninstall"`) {
		t.Errorf("exit %d, %q", code, errOut)
	}
}

// TestBusyPort: a busy address names the flag that moves it.
func TestBusyPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for flag, args := range map[string][]string{
		"--listen":       {"serve", "--listen", l.Addr().String(), "--admin-listen", "off"},
		"--admin-listen": {"serve", "--listen", "127.0.0.1:0", "--admin-listen", l.Addr().String()},
	} {
		code, _, errOut := runCmd(t, args...)
		if code != 1 || !strings.Contains(errOut, "address already in use") || !strings.Contains(errOut, "choose another address with "+flag) {
			t.Errorf("drip %q: exit %d, %q", args, code, errOut)
		}
	}
}
