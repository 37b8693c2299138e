package envoy

import (
	"context"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// settleRig serves domain llm on the memory store: tenant, a limit of
// 1000 a minute with settle, beside second, the same without; tokens
// reads a descriptor's bucket.
func settleRig(t *testing.T, second string) (r *running, tokens func(kv string) float64) {
	t.Helper()
	cfg, err := Parse(File{Name: "llm.yaml", Data: []byte(`domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000, settle: true}
  - key: ` + second + `
    rate_limit: {unit: minute, requests_per_unit: 1000}
`)})
	if err != nil {
		t.Fatal(err)
	}
	ms := memstore.New()
	t.Cleanup(func() { ms.Close() })
	r = serve(t, ms, cfg, false)
	tokens = func(kv string) float64 {
		t.Helper()
		l := drip.Limit{Rate: 1000, Period: 60e9, Burst: 1000}
		m, err := drip.Apply(context.Background(), ms, bucket.Peek, r.clock.Now(), drip.Request{Key: bucketKey("llm", entries(kv), nil), Limit: l})
		if err != nil {
			t.Fatal(err)
		}
		return m.Decisions[0].Tokens
	}
	return r, tokens
}

// TestSettleLimit: Envoy's plain apply_on_stream_done call, without a
// drip_settle entry, on a limit with "settle: true": the call that gives
// the descriptor its own hits_addend above 0 (Envoy's hits_addend of the
// stream-done rate limit) charges into bounded debt and is never denied;
// its own hits_addend of 0 (the request phase's check) is over the limit
// once the bucket is in debt; a call without its own hits_addend is a take
// of the request's, denied as any take. The same descriptor on a limit
// without settle is a take: the over-limit cost is refused and records
// nothing.
func TestSettleLimit(t *testing.T) {
	r, tokens := settleRig(t, "plain")
	own := func(kv string, hits uint64) *rlsv3.RateLimitResponse {
		d := desc(kv)
		d.HitsAddend = wrapperspb.UInt64(hits)
		return r.call(t, "llm", 0, d)
	}

	if c := own("tenant=a", 0).OverallCode; c != rlsv3.RateLimitResponse_OK {
		t.Fatalf("check: %v", c)
	}
	if c := own("tenant=a", 1500).OverallCode; c != rlsv3.RateLimitResponse_OK {
		t.Fatalf("stream-done charge of 1,500: %v, want OK", c)
	}
	if got := tokens("tenant=a"); got != -500 {
		t.Errorf("after a charge of 1,500: %v, want -500", got)
	}
	if c := own("tenant=a", 0).OverallCode; c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("check in debt: %v, want OVER_LIMIT", c)
	}
	// A call without the descriptor's own hits_addend is a take of the
	// request's (0: 1), refused in debt, and takes nothing.
	if c := r.call(t, "llm", 0, desc("tenant=a")).OverallCode; c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("take in debt: %v, want OVER_LIMIT", c)
	}
	if c := r.call(t, "llm", 3, desc("tenant=b")).OverallCode; c != rlsv3.RateLimitResponse_OK {
		t.Errorf("take of 3: %v, want OK", c)
	}
	if got := tokens("tenant=b"); got != 997 {
		t.Errorf("after a take of 3: %v, want 997", got)
	}
	if got := tokens("tenant=a"); got != -500 {
		t.Errorf("after the refused take: %v, want -500", got)
	}
	// The debt stops at one burst.
	own("tenant=a", 1e6)
	if got := tokens("tenant=a"); got < -1000 || got > -999.999 {
		t.Errorf("after 1,000,000 more: %v, want -1000", got)
	}
	// Without settle, the same call is a take: over the burst, refused,
	// nothing recorded.
	if c := own("plain=a", 1500).OverallCode; c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("plain 1,500: %v, want OVER_LIMIT", c)
	}
	if got := tokens("plain=a"); got != 1000 {
		t.Errorf("plain after the refused 1,500: %v, want 1000", got)
	}
}

// TestSettleParse: settle takes a boolean, on a limit that can hold a
// debt.
func TestSettleParse(t *testing.T) {
	for _, tc := range []struct{ rl, want string }{
		{"{unit: second, requests_per_unit: 0, settle: true}", "needs a limit of requests_per_unit > 0"},
		{"{unlimited: true, settle: true}", "needs a limit of requests_per_unit > 0"},
		{"{unit: second, requests_per_unit: 5, settle: maybe}", "settle"},
	} {
		_, err := Parse(File{Name: "x.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + tc.rl + "\n")})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.rl, err, tc.want)
		}
	}
	cfg, err := Parse(File{Name: "x.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, settle: false}\n")})
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.Match("d", entries("k=v")); l == nil || l.Settle {
		t.Errorf("settle: false: %+v", l)
	}
}

// TestSettleHuge: the largest hits_addend a charge may carry (1e12) runs
// the bucket into debt at most one burst, on a drip_settle descriptor and
// on a settle limit; one more is INVALID_ARGUMENT and takes nothing, from
// the other descriptors of the call too.
func TestSettleHuge(t *testing.T) {
	r, tokens := settleRig(t, "other")
	for _, d := range []*ratelimitv3.RateLimitDescriptor{desc("tenant=a"), desc("other=a", SettleKey+"=1")} {
		d.HitsAddend = wrapperspb.UInt64(1e12)
		if c := r.call(t, "llm", 0, d).OverallCode; c != rlsv3.RateLimitResponse_OK {
			t.Errorf("%v: a charge of 1e12: %v", d.Entries, c)
		}
	}
	for _, kv := range []string{"tenant=a", "other=a"} {
		if got := tokens(kv); got < -1000 || got > -999.999 {
			t.Errorf("%s after a charge of 1e12: %v, want -1000", kv, got)
		}
	}
	over := desc("tenant=b")
	over.HitsAddend = wrapperspb.UInt64(1e12 + 1)
	_, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("other=b"), over}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptors[1].hits_addend") {
		t.Errorf("a charge of 1e12+1: %v, want INVALID_ARGUMENT naming descriptors[1].hits_addend", err)
	}
	for _, kv := range []string{"tenant=b", "other=b"} {
		if got := tokens(kv); got != 1000 {
			t.Errorf("%s after the refused call: %v, want 1000", kv, got)
		}
	}
}
