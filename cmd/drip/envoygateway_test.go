package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/server/envoy/xds/xdstest"
)

// The configuration both drips answer with: as a file, and as the
// RateLimitConfig resource Envoy Gateway would send for it.
const gatewayFile = `domain: gw
descriptors:
  - key: path
    value: /a
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    value: /free
    rate_limit: {unlimited: true}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
    descriptors:
      - key: method
        value: POST
        rate_limit: {unit: day, requests_per_unit: 2}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
`

func gatewayConfig(extra ...*rlconfv3.RateLimitDescriptor) *rlconfv3.RateLimitConfig {
	descs := []*rlconfv3.RateLimitDescriptor{
		xdstest.Limit("path", "/a", 3, rlconfv3.RateLimitUnit_HOUR),
		{Key: "path", Value: "/free", RateLimit: &rlconfv3.RateLimitPolicy{Unlimited: true}},
		xdstest.Limit("user", "", 5, rlconfv3.RateLimitUnit_HOUR,
			xdstest.Limit("method", "POST", 2, rlconfv3.RateLimitUnit_DAY)),
		xdstest.Limit("blocked", "", 0, rlconfv3.RateLimitUnit_SECOND),
	}
	return xdstest.Config("default/gateway/listener", "gw", append(descs, extra...)...)
}

// TestEnvoyGatewayDropIn starts drip exactly as Envoy Gateway's rate limit
// Deployment starts envoyproxy/ratelimit (its container environment, with
// only the addresses of the xDS server and Redis, and the ports, chosen by
// the test; its certificates from a throwaway CA), against an xDS server
// serving over mutual TLS and a real Redis, and holds it to: the probe's
// /healthcheck on PORT; mutual TLS on the gRPC port; UNAVAILABLE until a
// first configuration (FORCE_START_WITHOUT_INITIAL_CONFIG=true); then the
// same answers as drip started on the same configuration as a file; a
// configuration pushed while it runs applies without a restart; an invalid
// one is NACKed and the one in force keeps answering.
func TestEnvoyGatewayDropIn(t *testing.T) {
	redis := testserver.StartRedis(t)
	ca := testserver.NewCA(t, "envoy-gateway")
	rlCert, rlKey := ca.Issue(t, ca.Dir(t), "envoy-ratelimit", "127.0.0.1") // the Secret envoy-rate-limit
	xdsCert, xdsKey := ca.Issue(t, ca.Dir(t), "envoy-gateway", "127.0.0.1") // Envoy Gateway's own
	envoyCert, envoyKey := ca.Issue(t, ca.Dir(t), "envoy", "127.0.0.1")     // the Envoy proxies'
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(ca.CAFile)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA: %v", err)
	}
	pair := func(c, k string) tls.Certificate {
		kp, err := tls.LoadX509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	xdsSrv := xdstest.Start(t, &tls.Config{Certificates: []tls.Certificate{pair(xdsCert, xdsKey)},
		ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}) // as Envoy Gateway serves it

	// The same configuration as a file, on drip started with flags only
	// (before the environment below is set), on another Redis database.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "gw.yaml"), []byte(gatewayFile), 0o644); err != nil {
		t.Fatal(err)
	}
	fileOut := startServe(t, "--listen", "off", "--admin-listen", "off", "--grpc-listen", "127.0.0.1:0", "--rules", dir, "--store", redis.URL()+"/1")
	m := grpcRe.FindStringSubmatch(fileOut)
	fileConn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer fileConn.Close()
	fromFile := rlsv3.NewRateLimitServiceClient(fileConn)

	// Envoy Gateway's environment (internal/infrastructure/kubernetes/
	// ratelimit: expectedRateLimitContainerEnv), certificate paths as
	// mounted, and the addresses of this test.
	for k, v := range map[string]string{
		"REDIS_SOCKET_TYPE":                  "tcp",
		"REDIS_URL":                          redis.Addr,
		"RUNTIME_ROOT":                       "/data",
		"RUNTIME_SUBDIRECTORY":               "ratelimit",
		"RUNTIME_IGNOREDOTFILES":             "true",
		"RUNTIME_WATCH_ROOT":                 "false",
		"LOG_LEVEL":                          "info",
		"USE_STATSD":                         "false",
		"CONFIG_TYPE":                        "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL":         xdsSrv.Addr,
		"CONFIG_GRPC_XDS_NODE_ID":            "envoy-ratelimit",
		"GRPC_SERVER_USE_TLS":                "true",
		"GRPC_SERVER_TLS_CERT":               rlCert,
		"GRPC_SERVER_TLS_KEY":                rlKey,
		"GRPC_SERVER_TLS_CA_CERT":            ca.CAFile,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS":     "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":    rlCert,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":     rlKey,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":  ca.CAFile,
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		// Free ports in place of the Deployment's 8081 and 8080, and
		// drip's admin listener kept off 9090 (other tests').
		"GRPC_PORT":         "0",
		"PORT":              "0",
		"DRIP_ADMIN_LISTEN": "127.0.0.1:0",
	} {
		t.Setenv(k, v)
	}
	// The container's command, /bin/ratelimit, alone.
	out := startServe(t, argsOf([]string{"/bin/ratelimit"})[1:]...)
	if !strings.Contains(out, " over TLS") {
		t.Fatalf("gRPC not over TLS:\n%s", out)
	}

	port := func(re *regexp.Regexp) string {
		m := re.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no %s in:\n%s", re, out)
		}
		_, p, err := net.SplitHostPort(m[1])
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	grpcPort, probePort := port(grpcAnyRe), port(regexp.MustCompile(`/healthcheck on http://(\S+) \(PORT\)`))

	// The readiness probe: GET /healthcheck on PORT, over plain HTTP;
	// nothing else there.
	probe := "http://127.0.0.1:" + probePort
	if code, body := httpGet(t, probe+"/healthcheck"); code != 200 || body != "OK\n" {
		t.Fatalf("/healthcheck: %d %q", code, body)
	}
	if code, _ := httpGet(t, probe+"/json"); code != 404 {
		t.Fatalf("/json on PORT: %d, want 404 (decisions only on the TLS gRPC port)", code)
	}

	grpcAddr := "127.0.0.1:" + grpcPort
	// Mutual TLS: without a client certificate, no call.
	anon, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "envoy-ratelimit"})))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := rlsv3.NewRateLimitServiceClient(anon).ShouldRateLimit(ctx, gwRequest(map[string]string{"path": "/a"})); err == nil {
		t.Fatal("a call without a client certificate was answered")
	}
	// Envoy, with its certificate, checking the service's name.
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, ServerName: "envoy-ratelimit", Certificates: []tls.Certificate{pair(envoyCert, envoyKey)}})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fromXDS := rlsv3.NewRateLimitServiceClient(conn)

	// Before a first configuration: UNAVAILABLE, as envoyproxy/ratelimit
	// answers an error with none loaded.
	if _, err := fromXDS.ShouldRateLimit(ctx, gwRequest(map[string]string{"path": "/a"})); status.Code(err) != codes.Unavailable {
		t.Fatalf("before any configuration: %v, want UNAVAILABLE", err)
	}

	xdsSrv.Push(t, "envoy-ratelimit", "1", gatewayConfig())
	xdsSrv.WaitAck(t, "1")

	// The same answers, call after call (the hourly and daily limits do
	// not refill in the test's time).
	reqs := []*rlsv3.RateLimitRequest{
		gwRequest(map[string]string{"path": "/a"}),
		gwRequest(map[string]string{"path": "/free"}),
		gwRequest(map[string]string{"user": "alice"}),
		gwRequest(map[string]string{"user": "alice"}, map[string]string{"method": "POST"}),
		gwRequest(map[string]string{"blocked": "x"}),
		gwRequest(map[string]string{"path": "/nowhere"}),
		gwRequest(map[string]string{"path": "/a"}, map[string]string{"user": "bob"}),
		{Domain: "other", Descriptors: gwRequest(map[string]string{"path": "/a"}).Descriptors},
	}
	overs := 0
	for round := range 7 {
		for i, r := range reqs {
			a, b := call(t, fromFile, r), call(t, fromXDS, r)
			if a != b {
				t.Fatalf("round %d, request %d: from the file %s, from xDS %s", round, i, a, b)
			}
			if strings.HasPrefix(b, "OVER_LIMIT") {
				overs++
			}
		}
	}
	if overs == 0 {
		t.Fatal("no request was over its limit: the comparison proves little")
	}

	// A configuration pushed while it runs: /b blocked. It applies
	// without a restart (the same connection), within seconds.
	b := gwRequest(map[string]string{"path": "/b"})
	if got := call(t, fromXDS, b); !strings.HasPrefix(got, "OK") {
		t.Fatalf("/b before the push: %s", got)
	}
	// Under load: callers all along, through the push and the NACK
	// below; none gets an error.
	loadCtx, stopLoad := context.WithCancel(context.Background())
	var load sync.WaitGroup
	var calls, failed atomic.Int64
	for range 4 {
		load.Go(func() {
			for loadCtx.Err() == nil {
				cctx, ccancel := context.WithTimeout(loadCtx, 30*time.Second)
				_, err := fromXDS.ShouldRateLimit(cctx, gwRequest(map[string]string{"user": "load"}))
				ccancel()
				if err != nil && loadCtx.Err() == nil {
					failed.Add(1)
				}
				calls.Add(1)
			}
		})
	}
	xdsSrv.Push(t, "envoy-ratelimit", "2", gatewayConfig(xdstest.Limit("path", "/b", 0, rlconfv3.RateLimitUnit_MINUTE)))
	waitFor(t, "the pushed configuration to apply", func() bool { return strings.HasPrefix(call(t, fromXDS, b), "OVER_LIMIT") })
	xdsSrv.WaitAck(t, "2")
	aBefore := call(t, fromXDS, reqs[0])

	// An invalid one: NACKed; the one in force keeps answering.
	xdsSrv.Push(t, "envoy-ratelimit", "3", xdstest.Config("default/gateway/listener", "gw", xdstest.Limit("path", "/b", 100, rlconfv3.RateLimitUnit_UNKNOWN)))
	if msg := xdsSrv.WaitNack(t, "3"); !strings.Contains(msg, "unit") {
		t.Fatalf("NACK: %q", msg)
	}
	if got := call(t, fromXDS, b); !strings.HasPrefix(got, "OVER_LIMIT") {
		t.Fatalf("/b after the NACK: %s: version 2 is not in force", got)
	}
	if got := call(t, fromXDS, reqs[0]); got != aBefore {
		t.Fatalf("/a after the NACK: %s, before it %s", got, aBefore)
	}
	stopLoad()
	load.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d calls under load failed", n, calls.Load())
	}
	if xdsSrv.Acked("3") {
		t.Fatal("the invalid configuration was ACKed")
	}
	if n := xdsSrv.Streams(); n != 1 {
		t.Fatalf("%d xDS streams: drip reconnected or restarted", n)
	}
}

var grpcAnyRe = regexp.MustCompile(`gRPC\) on (\S+)`)

// startServe runs "drip serve args..." in this process until the test
// ends and returns what it printed once it serves.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errs lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, append([]string{"serve", "--drain=0"}, args...), strings.NewReader(""), &out, &errs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case c := <-code:
			if c != 0 {
				t.Errorf("drip serve exited %d:\n%s", c, errs.String())
			}
		case <-time.After(15 * time.Second):
			t.Error("drip serve did not stop")
		}
	})
	for deadline := time.Now().Add(time.Minute); !grpcAnyRe.MatchString(out.String()); time.Sleep(10 * time.Millisecond) {
		select {
		case c := <-code:
			code <- c
			t.Fatalf("drip serve exited %d:\n%s%s", c, out.String(), errs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("drip serve did not say it serves gRPC within a minute:\n%s%s", out.String(), errs.String())
		}
	}
	return out.String()
}

// waitFor polls cond until it holds, for a generous minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
	}
}

func gwRequest(descs ...map[string]string) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: "gw"}
	// One descriptor of all the entries given, in order of the maps.
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, m := range descs {
		for k, v := range m {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
	}
	r.Descriptors = []*ratelimitv3.RateLimitDescriptor{d}
	return r
}

// call asks c and sums the answer up: the overall code, then each
// descriptor's code, limit and remaining (not the times, which move).
func call(t *testing.T, c rlsv3.RateLimitServiceClient, r *rlsv3.RateLimitRequest) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, r)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	var b strings.Builder
	b.WriteString(resp.OverallCode.String())
	for _, s := range resp.Statuses {
		fmt.Fprintf(&b, " [%s %d/%s %d]", s.Code, s.GetCurrentLimit().GetRequestsPerUnit(), s.GetCurrentLimit().GetUnit(), s.LimitRemaining)
	}
	return b.String()
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
