package envoy

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store/memstore"
)

// TestSettleDescriptor: Envoy's apply_on_stream_done call, with the
// drip_settle entry, charges the bucket of the descriptor without it:
// never denied, into debt at most one burst (the limit has no
// max_reserved), the rest forgiven; the request-phase call then finds the
// bucket in debt and is over the limit.
func TestSettleDescriptor(t *testing.T) {
	cfg, err := Parse(File{Name: "llm.yaml", Data: []byte(`domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000}
`)})
	if err != nil {
		t.Fatal(err)
	}
	ms := memstore.New()
	t.Cleanup(func() { ms.Close() })
	r := serve(t, ms, cfg, false)
	tokens := func(tenant string) float64 {
		t.Helper()
		l := drip.Limit{Rate: 1000, Period: 60e9, Burst: 1000}
		m, err := drip.Apply(context.Background(), ms, bucket.Peek, r.clock.Now(), drip.Request{Key: bucketKey("llm", entries("tenant="+tenant), nil), Limit: l})
		if err != nil {
			t.Fatal(err)
		}
		return m.Decisions[0].Tokens
	}
	settle := func(tenant string, hits uint64) *rlsv3.RateLimitResponse {
		d := desc("tenant="+tenant, SettleKey+"=1")
		d.HitsAddend = wrapperspb.UInt64(hits)
		return r.call(t, "llm", 0, d)
	}
	check := func(tenant string) rlsv3.RateLimitResponse_Code {
		d := desc("tenant=" + tenant)
		d.HitsAddend = wrapperspb.UInt64(0) // a peek: envoyproxy/ratelimit's pattern before the charge
		return r.call(t, "llm", 0, d).OverallCode
	}

	if c := check("a"); c != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first check: %v", c)
	}
	if resp := settle("a", 700); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("charge of 700: %v", resp.OverallCode)
	}
	if got := tokens("a"); got != 300 {
		t.Errorf("after 700: %v, want 300", got)
	}
	// Past the bucket: into debt, still OK (Envoy ignores the answer).
	if resp := settle("a", 800); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("charge of 800: %v", resp.OverallCode)
	}
	if got := tokens("a"); got != -500 {
		t.Errorf("after 1,500: %v, want -500", got)
	}
	if c := check("a"); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("check in debt: %v, want OVER_LIMIT", c)
	}
	// The debt stops at one burst: 5,000 more are charged down to -1,000.
	settle("a", 5000)
	if got := tokens("a"); got < -1000 || got > -999.999 {
		t.Errorf("after 5,000 more: %v, want -1000", got)
	}
	// A descriptor that is only the settle entry matches nothing.
	if resp := r.call(t, "llm", 5, &ratelimitv3.RateLimitDescriptor{Entries: entries(SettleKey + "=1")}); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("settle entry alone: %v", resp.OverallCode)
	}
}
