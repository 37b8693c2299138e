package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/server"
)

// lockedBuffer is an io.Writer safe for a command writing while the test
// reads.
type lockedBuffer = testserver.LockedBuffer

var listenRe = regexp.MustCompile(`(decision API|gateway) on http://([0-9.:]+)`)
var adminRe = regexp.MustCompile(`metrics on http://([0-9.:]+)/metrics`)

// serveInProcess runs "drip serve args..." until the test ends and
// returns the decision API and admin addresses it printed. It stops
// without a drain unless args give --drain.
func serveInProcess(t *testing.T, args ...string) (api, admin string, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errs lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, append([]string{"serve", "--drain=0"}, args...), strings.NewReader(""), &out, &errs)
	}()
	var once sync.Once
	exit := -1
	stop = func() int {
		once.Do(func() {
			cancel()
			select {
			case exit = <-code:
			case <-time.After(15 * time.Second):
				t.Errorf("drip serve did not stop after its context was cancelled")
			}
		})
		return exit
	}
	t.Cleanup(func() { stop() })
	deadline := time.Now().Add(time.Minute) // generous: how fast is not tested
	for {
		if m := listenRe.FindStringSubmatch(out.String()); m != nil {
			api = m[2]
			if m := adminRe.FindStringSubmatch(out.String()); m != nil {
				admin = m[1]
			}
			return api, admin, stop
		}
		select {
		case c := <-code:
			t.Fatalf("drip serve exited with %d before listening:\n%s%s", c, out.String(), errs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("drip serve did not say where it listens:\n%s%s", out.String(), errs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeNoFlags: "drip serve" alone runs on the memory store with the
// built-in rules. The addresses come from the environment here, so that
// the test does not need ports 8080 and 9090.
func TestServeNoFlags(t *testing.T) {
	t.Setenv("DRIP_LISTEN", "127.0.0.1:0")
	t.Setenv("DRIP_ADMIN_LISTEN", "127.0.0.1:0")
	api, admin, stop := serveInProcess(t)
	code, out := httpDo(t, "POST", "http://"+api+"/v1/take", `{"rule": "per-ip", "values": ["192.0.2.1"]}`)
	if code != 200 || !strings.Contains(out, `"allowed":true`) || !strings.Contains(out, `"limit":20`) {
		t.Fatalf("take on the default rules: %d %s", code, out)
	}
	if code, out := httpDo(t, "GET", "http://"+admin+"/readyz", ""); code != 200 {
		t.Fatalf("/readyz: %d %s", code, out)
	}
	if c := stop(); c != 0 {
		t.Fatalf("drip serve exited with %d after its context was cancelled, want 0", c)
	}
}

// TestServeDefaultAddresses: with no flags and no environment at all, drip
// serve listens on 127.0.0.1:8080 and :9090. The test reads the defaults
// from the help text instead of binding those ports, which another
// process (or another test binary) may hold.
func TestServeDefaultAddresses(t *testing.T) {
	for _, v := range []string{"DRIP_LISTEN", "DRIP_ADMIN_LISTEN", "DRIP_ADMIN_TOKEN", "DRIP_RULES", "DRIP_STORE", "DRIP_UPSTREAM", "DRIP_GRPC_LISTEN", "DRIP_STORE_TIMEOUT", "DRIP_DRAIN"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	var out, errs bytes.Buffer
	run(t.Context(), []string{"serve", "-h"}, strings.NewReader(""), &out, &errs)
	help := out.String() + errs.String()
	for _, flag := range []string{"listen", "admin-listen", "drain"} {
		want := map[string]string{"listen": `"127.0.0.1:8080"`, "admin-listen": `"127.0.0.1:9090"`, "drain": server.DefaultDrain.String()}[flag]
		if !regexp.MustCompile(`(?m)^\s*-` + flag + ` .*\n.*\(default ` + regexp.QuoteMeta(want) + `\)`).MatchString(help) {
			t.Errorf("serve -h does not give --%s the default %s:\n%s", flag, want, help)
		}
	}
}

func TestServeFlags(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write := func(body string) {
		if err := os.WriteFile(path+".tmp", []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write("rules:\n  - name: a\n    limit_keys: [\"header:x-k\"]\n    algorithm_config: {rps: 1, burst: 2}\n")
	t.Setenv("DRIP_ADMIN_TOKEN", "tok")
	api, admin, stop := serveInProcess(t, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--rules", path, "--store", "memory")
	if code, out := httpDo(t, "POST", "http://"+api+"/v1/take", `{"rule": "a", "values": ["x"]}`); code != 200 {
		t.Fatalf("take by rule a: %d %s", code, out)
	}
	// SIGHUP reloads the rules.
	write("rules:\n  - name: b\n    limit_keys: [\"header:x-k\"]\n    algorithm_config: {rps: 1, burst: 2}\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute) // generous: how fast is not tested
	for {
		code, _ := httpDo(t, "POST", "http://"+api+"/v1/take", `{"rule": "b", "values": ["x"]}`)
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP (or the file watcher) did not reload the rules")
		}
		time.Sleep(10 * time.Millisecond)
	}
	req, _ := http.NewRequest("POST", "http://"+admin+"/v1/admin/reload", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("admin reload with DRIP_ADMIN_TOKEN: %v %v", resp, err)
	}
	resp.Body.Close()
	if c := stop(); c != 0 {
		t.Fatalf("exit %d", c)
	}
}

func TestServeBadSettings(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"rules": [{"name": "x", "algorithm": "leaky"}]}`), 0o644)
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--rules", bad}, 1, "rules[0].algorithm"},
		{[]string{"--rules", filepath.Join(dir, "missing.json")}, 1, "no such file"},
		{[]string{"--store", "nosuch://x"}, 1, "unknown store"},
		{[]string{"--upstream", "localhost:1"}, 1, "upstream"},
		{[]string{"--listen", "256.0.0.1:1"}, 1, "listener"},
		{[]string{"--bogus"}, 2, "flag provided but not defined"},
		{[]string{"--drain", "-1s"}, 2, "--drain -1s is negative"},
		{[]string{"extra"}, 2, "unexpected arguments"},
	} {
		var out, errs bytes.Buffer
		args := append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, tc.args...)
		code := run(t.Context(), args, strings.NewReader(""), &out, &errs)
		if code != tc.code || !strings.Contains(errs.String(), tc.msg) {
			t.Errorf("drip %v: exit %d, stderr %q; want exit %d with %q", tc.args, code, errs.String(), tc.code, tc.msg)
		}
	}
}

// TestServeDrain: --drain and DRIP_DRAIN set how long drip serve drains
// when it is told to stop (server.Config.Drain; server's TestDrain tests
// the drain itself), 0 none; a bad value is refused.
func TestServeDrain(t *testing.T) {
	serve := func(args ...string) (stderr string) {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		var out, errs lockedBuffer
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "off"}, args...), strings.NewReader(""), &out, &errs)
		}()
		deadline := time.Now().Add(time.Minute) // generous: how long start-up takes is not what this tests
		for !strings.Contains(out.String(), "decision API on") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("drip serve %v: exit %d\n%s", args, code, errs.String())
			}
		case <-time.After(time.Minute):
			t.Fatalf("drip serve %v did not stop", args)
		}
		return errs.String()
	}
	if errs := serve("--drain", "1ms"); !strings.Contains(errs, "draining") || !strings.Contains(errs, "for=1ms") {
		t.Errorf("--drain 1ms: stderr %q, want a drain of 1ms", errs)
	}
	t.Setenv("DRIP_DRAIN", "2ms")
	if errs := serve(); !strings.Contains(errs, "for=2ms") {
		t.Errorf("DRIP_DRAIN=2ms: stderr %q, want a drain of 2ms", errs)
	}
	if errs := serve("--drain", "0"); strings.Contains(errs, "draining") {
		t.Errorf("--drain 0: stderr %q, want no drain", errs)
	}
	t.Setenv("DRIP_DRAIN", "soon")
	var out, errs bytes.Buffer
	if code := run(t.Context(), []string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "off"}, strings.NewReader(""), &out, &errs); code != 2 || !strings.Contains(errs.String(), `DRIP_DRAIN="soon"`) {
		t.Errorf("DRIP_DRAIN=soon: exit %d, stderr %q; want exit 2 naming it", code, errs.String())
	}
}
