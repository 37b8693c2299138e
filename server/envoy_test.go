package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/driplimit/drip/store/memstore"
)

const edgeYAML = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: %d
`

func envoyFile(t *testing.T, path string, rpu int) {
	t.Helper()
	writeFile(t, path, fmt.Sprintf(edgeYAML, rpu))
}

func grpcClient(t *testing.T, s *Server) (rlsv3.RateLimitServiceClient, healthpb.HealthClient) {
	t.Helper()
	a := s.GRPCAddr()
	if a == nil {
		t.Fatal("no gRPC listener")
	}
	conn, err := grpc.NewClient(a.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn), healthpb.NewHealthClient(conn)
}

func shouldRateLimit(t *testing.T, c rlsv3.RateLimitServiceClient, addr string) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain:      "edge",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: addr}}}},
	})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// TestEnvoyGRPC serves a --rules directory holding a drip rules file and
// an envoyproxy/ratelimit file: the decision API uses the one, Envoy's
// rate limit service the other, and both reload together.
func TestEnvoyGRPC(t *testing.T) {
	dir := t.TempDir()
	rulesFile(t, filepath.Join(dir, "rules.json"), 3, "api")
	edge := filepath.Join(dir, "edge.yaml")
	envoyFile(t, edge, 5)
	srv := start(t, Config{Rules: dir, GRPCListen: "127.0.0.1:0", WatchEvery: -1}, memstore.New())
	c, h := grpcClient(t, srv.Server)

	if resp, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", resp, err)
	}
	for i := range 5 {
		if resp := shouldRateLimit(t, c, "1.2.3.4"); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != uint32(4-i) {
			t.Fatalf("call %d: %v", i+1, resp)
		}
	}
	if resp := shouldRateLimit(t, c, "1.2.3.4"); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("call 6: %v, want OVER_LIMIT after the burst of 5", resp)
	}
	if code, out := post(t, srv.base+"/v1/take", `{"rule": "api", "values": ["k"]}`); code != 200 || !strings.Contains(out, `"allowed":true`) {
		t.Fatalf("decision API by rule beside envoy files: %d %s", code, out)
	}
	_, metrics := call(t, "GET", srv.admin+"/metrics", "")
	for _, want := range []string{`drip_decisions_total{mode="enforce",outcome="allowed",rule="envoy:edge.remote_address"} 5`, `drip_decisions_total{mode="enforce",outcome="denied",rule="envoy:edge.remote_address"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("metrics lack %s:\n%s", want, grep(metrics, "envoy"))
		}
	}

	// Reload: the new limit applies; the bucket keeps its state.
	envoyFile(t, edge, 50)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	resp := shouldRateLimit(t, c, "1.2.3.4")
	if resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 50 || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after reload: %v, want 50/min and still empty", resp)
	}
	// A bad file keeps the config in force.
	writeFile(t, edge, "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	if err := srv.Reload(); err == nil || !strings.Contains(err.Error(), "invalid rate limit unit 'fortnight'") {
		t.Fatalf("bad reload: %v", err)
	}
	if resp := shouldRateLimit(t, c, "5.6.7.8"); resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 50 {
		t.Fatalf("after a bad reload: %v", resp)
	}
}

// TestEnvoyWatch: a change to a file of the --rules directory reloads.
func TestEnvoyWatch(t *testing.T) {
	dir := t.TempDir()
	edge := filepath.Join(dir, "edge.yaml")
	envoyFile(t, edge, 5)
	srv, poll := startWatched(t, Config{Rules: dir, GRPCListen: "127.0.0.1:0"}, memstore.New())
	c, _ := grpcClient(t, srv.Server)
	if resp := shouldRateLimit(t, c, "a"); resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 {
		t.Fatalf("%v", resp)
	}
	envoyFile(t, edge, 7)
	poll()
	if resp := shouldRateLimit(t, c, "a"); resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 7 {
		t.Fatalf("the watcher did not reload the changed file: %v", resp)
	}
	// A new file in the directory is a new domain.
	writeFile(t, filepath.Join(dir, "other.yaml"), "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	poll()
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "other",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Statuses[0].CurrentLimit == nil {
		t.Fatalf("the watcher did not load the new file: %v", resp)
	}
}

func TestEnvoyRulesPaths(t *testing.T) {
	// An envoyproxy/ratelimit file alone: no drip rules.
	dir := t.TempDir()
	edge := filepath.Join(dir, "edge.yaml")
	envoyFile(t, edge, 5)
	srv := start(t, Config{Rules: edge, GRPCListen: "127.0.0.1:0", WatchEvery: -1}, memstore.New())
	c, _ := grpcClient(t, srv.Server)
	if resp := shouldRateLimit(t, c, "a"); resp.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("%v", resp)
	}
	if code, out := post(t, srv.base+"/v1/take", `{"rule": "api", "values": ["k"]}`); code != 404 {
		t.Fatalf("a rule with no drip rules file: %d %s", code, out)
	}

	// Two drip rules files in one directory.
	two := t.TempDir()
	rulesFile(t, filepath.Join(two, "a.json"), 3, "a")
	rulesFile(t, filepath.Join(two, "b.json"), 3, "b")
	if _, err := New(Config{Rules: two}, memstore.New()); err == nil || !strings.Contains(err.Error(), "2 drip rules files (a.json, b.json)") {
		t.Fatalf("two drip files: %v", err)
	}
	// A directory with no rules file.
	if _, err := New(Config{Rules: t.TempDir()}, memstore.New()); err == nil || !strings.Contains(err.Error(), "no *.yaml") {
		t.Fatalf("empty dir: %v", err)
	}
	// Two files of one domain.
	envoyFile(t, filepath.Join(dir, "edge2.yaml"), 6)
	if _, err := New(Config{Rules: dir}, memstore.New()); err == nil || !strings.Contains(err.Error(), `duplicate domain "edge"`) {
		t.Fatalf("duplicate domain: %v", err)
	}
	os.Remove(filepath.Join(dir, "edge2.yaml"))
}

// TestGRPCTLSNeedsListener: TLS for a gRPC listener that is not there is
// refused at New: it would guard nothing, while the admin listener's POST
// /json decided for any client in plaintext (ClientCertsRequired is false
// without a gRPC listener).
func TestGRPCTLSNeedsListener(t *testing.T) {
	mtls := &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert}
	_, err := New(Config{Listen: "off", AdminListen: "127.0.0.1:0", GRPCTLS: mtls}, memstore.New())
	if err == nil || !strings.Contains(err.Error(), "GRPCListen") {
		t.Fatalf("New with GRPCTLS and no GRPCListen: %v, want a refusal naming GRPCListen", err)
	}
}
