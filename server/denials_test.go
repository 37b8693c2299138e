package server

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/testkit/teststores"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestLocalDenials: on Redis, the decision API denies a key over its
// limit from the store's last answer (no store call, counted in
// drip_local_denials_total), and a reset through the admin API clears
// the proof at once.
func TestLocalDenials(t *testing.T) {
	srv := start(t, Config{DenialStale: time.Hour, AdminToken: "T"}, teststores.Open(t, "redis"))
	k := `{"key": "hot", ` + lim + `}`
	take := func() bool {
		t.Helper()
		code, out := post(t, srv.base+"/v1/take", k)
		if code != http.StatusOK {
			t.Fatalf("take: %d %s", code, out)
		}
		return decision(t, out).Allowed
	}
	for i, want := range []bool{true, true, true, false, false, false} {
		if got := take(); got != want {
			t.Fatalf("take %d: allowed %v", i, got)
		}
	}
	metrics := func() string {
		t.Helper()
		_, out := call(t, "GET", srv.admin+"/metrics", "")
		return out
	}
	out := metrics()
	for _, want := range []string{`drip_store_duration_seconds_count{op="take"} 4`, "drip_local_denials_total 2", "drip_local_denial_bytes 3"} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, grep(out, "drip_"))
		}
	}
	if code, out := call(t, "POST", srv.admin+"/v1/admin/reset", `{"key": "inline:hot"}`, "Authorization", "Bearer T"); code != http.StatusOK {
		t.Fatalf("reset: %d %s", code, out)
	}
	if !take() {
		t.Fatal("denied after a reset")
	}
	if out := metrics(); !strings.Contains(out, `drip_store_duration_seconds_count{op="take"} 5`) {
		t.Errorf("the take after the reset did not reach the store:\n%s", grep(out, "drip_store"))
	}
}

// TestLocalDenialsEnvoy: Envoy's rate limit service on Redis denies an
// address over its limit from the store's last answer.
func TestLocalDenialsEnvoy(t *testing.T) {
	dir := t.TempDir()
	envoyFile(t, filepath.Join(dir, "edge.yaml"), 2)
	srv := start(t, Config{Rules: dir, GRPCListen: "127.0.0.1:0", WatchEvery: -1, DenialStale: time.Hour}, teststores.Open(t, "redis"))
	c, _ := grpcClient(t, srv.Server)
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK,
		rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := shouldRateLimit(t, c, "10.0.0.1").OverallCode; got != want {
			t.Fatalf("call %d: %v, want %v", i, got, want)
		}
	}
	_, out := call(t, "GET", srv.admin+"/metrics", "")
	for _, want := range []string{`drip_store_duration_seconds_count{op="take"} 3`, "drip_local_denials_total 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, grep(out, "drip_"))
		}
	}
}
