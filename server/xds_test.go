package server

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/server/envoy/xds"
	"github.com/driplimit/drip/server/envoy/xds/xdstest"
	"github.com/driplimit/drip/store/memstore"
)

// TestXDSWaitsForConfig: without XDSForceStart, Serve serves nothing until
// a first snapshot applies (as envoyproxy/ratelimit does not start), and
// a context ended before one returns cleanly.
func TestXDSWaitsForConfig(t *testing.T) {
	srv := xdstest.Start(t, nil)
	cfg := Config{Listen: "127.0.0.1:0", AdminListen: "off", GRPCListen: "127.0.0.1:0", Drain: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		XDS:    &xds.Config{Server: srv.Addr, NodeID: "n", Backoff: xds.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}}}
	s, err := New(cfg, memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	serving := make(chan struct{})
	s.serving = func() { close(serving) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	select {
	case <-serving:
		t.Fatal("serving before any configuration")
	case <-time.After(200 * time.Millisecond): // an absence: a short look
	}
	srv.Push(t, "n", "1", xdstest.Config("c", "d", xdstest.Limit("k", "", 1, rlconfv3.RateLimitUnit_SECOND)))
	select {
	case <-serving:
	case <-time.After(xdstest.Wait):
		t.Fatal("not serving after the first configuration")
	}
	if got := s.rls.Config().Domains(); len(got) != 1 || got[0] != "d" {
		t.Fatalf("domains %q", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Ended before any configuration: Serve returns nil.
	s, err = New(Config{Listen: "127.0.0.1:0", AdminListen: "off", Drain: -1, Logger: cfg.Logger,
		XDS: &xds.Config{Server: "127.0.0.1:1", NodeID: "n"}}, memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() { done <- s.Serve(ctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return")
	}

	// Files and xDS together: refused.
	if _, err := New(Config{Rules: "testdata/rules.json", XDS: &xds.Config{Server: "x:1", NodeID: "n"}}, memstore.New()); err == nil || !strings.Contains(err.Error(), "--rules") {
		t.Fatalf("--rules with xDS: %v", err)
	}
}

// TestXDSForceStart: with XDSForceStart the server serves at once; until
// a first snapshot ShouldRateLimit is UNAVAILABLE (gRPC test in
// cmd/drip), /json 503 and, with HealthNeedsConfig, /healthcheck 500;
// then they answer.
func TestXDSForceStart(t *testing.T) {
	srv := xdstest.Start(t, nil)
	r := start(t, Config{HealthListen: "127.0.0.1:0", XDSForceStart: true, HealthNeedsConfig: true,
		XDS: &xds.Config{Server: srv.Addr, NodeID: "n", Backoff: xds.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}}}, memstore.New())
	health := "http://" + r.HealthAddr().String() + "/healthcheck"
	body := `{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}`
	if code, _ := call(t, "GET", health, ""); code != 500 {
		t.Fatalf("/healthcheck before a configuration: %d", code)
	}
	if code, _ := call(t, "POST", r.admin+"/json", body); code != 503 {
		t.Fatalf("/json before a configuration: %d", code)
	}
	srv.Push(t, "n", "1", xdstest.Config("c", "d", xdstest.Limit("k", "", 1, rlconfv3.RateLimitUnit_HOUR)))
	srv.WaitAck(t, "1")
	if code, b := call(t, "GET", health, ""); code != 200 || b != "OK\n" {
		t.Fatalf("/healthcheck: %d %q", code, b)
	}
	if code, _ := call(t, "GET", "http://"+r.HealthAddr().String()+"/metrics", ""); code != 404 {
		t.Fatalf("/metrics on the health listener: %d", code)
	}
	for i, want := range []int{200, 429} {
		if code, b := call(t, "POST", r.admin+"/json", body); code != want {
			t.Fatalf("/json call %d: %d %s, want %d", i, code, b, want)
		}
	}

	// An invalid snapshot: counted as a failed reload; the old one
	// answers on.
	srv.Push(t, "n", "2", xdstest.Config("c", "d", xdstest.Limit("k", "", 1, rlconfv3.RateLimitUnit_UNKNOWN)))
	srv.WaitNack(t, "2")
	_, m := call(t, "GET", r.admin+"/metrics", "")
	for _, want := range []string{`drip_rules_reloads_total{result="ok"} 1`, `drip_rules_reloads_total{result="error"} 1`, "drip_rules_last_reload_ok 0"} { // read once, NACKed twice (xds.go)
		if !strings.Contains(m, want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, m)
		}
	}
	if code, _ := call(t, "POST", r.admin+"/json", body); code != 429 {
		t.Fatalf("/json after the NACK: %d, want 429 (the old snapshot)", code)
	}
}

// TestXDSSeriesFollowSnapshots: the per-limit series on /metrics are
// those of the snapshot in force, whatever came before: two large
// snapshots of different routes, then a small one, leave the small
// one's series and no other.
func TestXDSSeriesFollowSnapshots(t *testing.T) {
	srv := xdstest.Start(t, nil)
	r := start(t, Config{XDSForceStart: true, XDS: &xds.Config{Server: srv.Addr, NodeID: "n", Backoff: xds.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}}}, memstore.New())
	envoySeries := func() int {
		n := 0
		for k := range decisionSeries(scrape(t, r.admin)) {
			if strings.Contains(k, "rule=envoy:") {
				n++
			}
		}
		return n
	}
	const big = 3000
	for i, prefix := range []string{"a", "b"} {
		v := strconv.Itoa(i + 1)
		srv.Push(t, "n", v, routes("big", prefix, big))
		srv.WaitAck(t, v)
		// One decision, so that a counted series is among those to go.
		if code, out := call(t, "POST", r.admin+"/json", `{"domain": "big", "descriptors": [{"entries": [{"key": "route", "value": "`+prefix+`7"}]}]}`); code != 200 {
			t.Fatalf("/json: %d %s", code, out)
		}
		if n := envoySeries(); n != 5*big {
			t.Fatalf("snapshot %s: %d Envoy series, want %d", v, n, 5*big)
		}
	}
	srv.Push(t, "n", "3", routes("small", "c", 1))
	srv.WaitAck(t, "3")
	got := decisionSeries(scrape(t, r.admin))
	n := 0
	for k := range got {
		if strings.Contains(k, "rule=envoy:") {
			n++
			if !strings.Contains(k, "rule=envoy:small.route_c0}") {
				t.Errorf("after the small snapshot: %s", k)
			}
		}
	}
	if n != 5 {
		t.Fatalf("after the small snapshot: %d Envoy series, want 5 (allowed, denied, not_taken, refunded, error)", n)
	}
}

// TestXDSEmptySnapshot: a snapshot without limits applies (every call is
// then OK, as in envoyproxy/ratelimit), but not silently: a warning in
// the log and drip_envoy_limits_loaded at 0.
func TestXDSEmptySnapshot(t *testing.T) {
	srv := xdstest.Start(t, nil)
	log := &testserver.LockedBuffer{}
	r := start(t, Config{XDSForceStart: true, Logger: slog.New(slog.NewTextHandler(log, nil)),
		XDS: &xds.Config{Server: srv.Addr, NodeID: "n", Backoff: xds.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}}}, memstore.New())
	body := `{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}`
	srv.Push(t, "n", "1", xdstest.Config("c", "d", xdstest.Limit("k", "", 0, rlconfv3.RateLimitUnit_SECOND)))
	srv.WaitAck(t, "1")
	if code, _ := call(t, "POST", r.admin+"/json", body); code != 429 {
		t.Fatalf("/json under a limit of 0: %d", code)
	}
	if v := scrape(t, r.admin)["drip_envoy_limits_loaded{}"]; v != 1 {
		t.Fatalf("drip_envoy_limits_loaded %v, want 1", v)
	}
	if strings.Contains(log.String(), "level=WARN") {
		t.Fatalf("a warning for a snapshot with limits:\n%s", log.String())
	}
	for _, v := range []string{"2", "3"} {
		if v == "2" {
			srv.Push(t, "n", v) // no resource
		} else {
			srv.Push(t, "n", v, xdstest.Config("c", "d")) // a domain without descriptors
		}
		srv.WaitAck(t, v)
		if code, _ := call(t, "POST", r.admin+"/json", body); code != 200 {
			t.Fatalf("/json under snapshot %s: %d", v, code)
		}
		if got := scrape(t, r.admin)["drip_envoy_limits_loaded{}"]; got != 0 {
			t.Fatalf("snapshot %s: drip_envoy_limits_loaded %v, want 0", v, got)
		}
		var warned bool
		for _, line := range strings.Split(log.String(), "\n") {
			warned = warned || strings.Contains(line, "level=WARN") && strings.Contains(line, "no limits") && strings.Contains(line, "version="+v)
		}
		if !warned {
			t.Fatalf("no warning of snapshot %s without limits:\n%s", v, log.String())
		}
	}
}
