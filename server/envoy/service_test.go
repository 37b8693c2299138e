package envoy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// stores are the stores every end-to-end case runs on. On Redis Cluster a
// call's descriptors land in different hash slots: the service takes them
// one by one (store.Separately).
var stores = teststores.Shared()

// running is a gRPC server on a free port and a client of it.
type running struct {
	svc    *Service
	srv    *Server
	conn   *grpc.ClientConn
	client rlsv3.RateLimitServiceClient
	clock  *testclock.Clock // the service's: no test sleeps
}

func serve(t *testing.T, store store.Store, cfg *Config, reflect bool) *running {
	t.Helper()
	ck := testclock.At(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	svc := NewService(store, cfg, engine.WithClock(ck.Now), engine.WithTimeout(teststores.Timeout))
	srv := NewServer(svc, reflect)
	conn, done := listen(t, srv)
	t.Cleanup(func() {
		conn.Close() // before the graceful shutdown, which waits for it
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return &running{svc: svc, srv: srv, conn: conn, client: rlsv3.NewRateLimitServiceClient(conn), clock: ck}
}

// listen serves srv on a free loopback port and returns a client
// connection to it, closed when the test ends, and what Serve returns.
func listen(t *testing.T, srv *Server) (*grpc.ClientConn, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, served
}

// desc builds a descriptor from "key=value" pairs.
func desc(kvs ...string) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{Entries: entries(kvs...)}
}

func (r *running) call(t *testing.T, domain string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func hdrs(h []*corev3.HeaderValue) string {
	var b strings.Builder
	for _, v := range h {
		fmt.Fprintf(&b, "%s: %s\n", v.Key, v.Value)
	}
	return b.String()
}

// TestEndToEnd runs the README configuration through a real gRPC client
// on every store.
func TestEndToEnd(t *testing.T) {
	for _, st := range stores {
		t.Run(st.Name, func(t *testing.T) {
			r := serve(t, st.Open(t), loadReadme(t), false)
			t.Run("burst", func(t *testing.T) { testBurst(t, r) })
			t.Run("all-or-nothing", func(t *testing.T) { testAllOrNothing(t, r) })
			t.Run("shadow", func(t *testing.T) { testShadow(t, r) })
			t.Run("hits", func(t *testing.T) { testHits(t, r) })
			t.Run("kinds", func(t *testing.T) { testKinds(t, r) })
		})
	}
}

// testBurst: a limit of 10/s allows exactly its burst of 10 at one
// instant, then denies with exact statuses and headers, and refills
// continuously.
func testBurst(t *testing.T, r *running) {
	d := desc("remote_address=10.0.0.1")
	key := bucketKey("edge_proxy_per_ip", d.Entries, nil)
	for i := range 10 {
		resp := r.call(t, "edge_proxy_per_ip", 0, d)
		if resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v, want OK", i+1, resp.OverallCode)
		}
		s := resp.Statuses[0]
		if s.Code != rlsv3.RateLimitResponse_OK || s.LimitRemaining != uint32(9-i) ||
			s.CurrentLimit.GetRequestsPerUnit() != 10 || s.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND {
			t.Fatalf("call %d: status %v", i+1, s)
		}
		if got, want := s.DurationUntilReset.AsDuration(), time.Duration(i+1)*100*time.Millisecond; got != want {
			t.Fatalf("call %d: duration_until_reset %v, want %v", i+1, got, want)
		}
		if i == 0 {
			want := "RateLimit-Policy: \"edge_proxy_per_ip.remote_address\";q=10;w=1\n" +
				"RateLimit: \"edge_proxy_per_ip.remote_address\";r=9;t=1\n" +
				"RateLimit-Limit: 10\nRateLimit-Remaining: 9\nRateLimit-Reset: 1\n"
			if got := hdrs(resp.ResponseHeadersToAdd); got != want {
				t.Fatalf("headers:\n%s\nwant:\n%s", got, want)
			}
		}
	}
	resp := r.call(t, "edge_proxy_per_ip", 0, d)
	s := resp.Statuses[0]
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || s.Code != rlsv3.RateLimitResponse_OVER_LIMIT || s.LimitRemaining != 0 {
		t.Fatalf("call 11: %v %v, want OVER_LIMIT", resp.OverallCode, s)
	}
	if got := s.DurationUntilReset.AsDuration(); got != 100*time.Millisecond {
		t.Fatalf("call 11: duration_until_reset %v, want the wait of 100ms", got)
	}
	retry := (rules.Jitter{Fraction: 0.5, Max: math.MaxInt64}).Seconds(key, 100*time.Millisecond)
	if retry < 1 || retry > 2 {
		t.Fatalf("retry %d", retry)
	}
	want := "RateLimit-Policy: \"edge_proxy_per_ip.remote_address\";q=10;w=1\n" +
		fmt.Sprintf("RateLimit: \"edge_proxy_per_ip.remote_address\";r=0;t=%d\n", retry) +
		fmt.Sprintf("RateLimit-Limit: 10\nRateLimit-Remaining: 0\nRateLimit-Reset: %d\nRetry-After: %d\n", retry, retry)
	if got := hdrs(resp.ResponseHeadersToAdd); got != want {
		t.Fatalf("headers on denial:\n%s\nwant:\n%s", got, want)
	}
	// Continuous refill: one request every 100ms, not 10 at the next
	// second.
	r.clock.Add(99 * time.Millisecond)
	if resp := r.call(t, "edge_proxy_per_ip", 0, d); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatal("allowed before a token refilled")
	}
	r.clock.Add(time.Millisecond)
	if resp := r.call(t, "edge_proxy_per_ip", 0, d); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("after 100ms: %v", resp)
	}
	if resp := r.call(t, "edge_proxy_per_ip", 0, d); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatal("a second request allowed on one refilled token")
	}
	// Another address has its own bucket.
	if resp := r.call(t, "edge_proxy_per_ip", 0, desc("remote_address=10.0.0.2")); resp.Statuses[0].LimitRemaining != 9 {
		t.Fatalf("other address: %v", resp.Statuses[0])
	}
}

// testAllOrNothing: when one descriptor is over its limit, none is
// charged.
func testAllOrNothing(t *testing.T, r *running) {
	marketing, number := desc("message_type=marketing", "to_number=2061111111"), desc("to_number=2061111111")
	for i := range 5 {
		resp := r.call(t, "messaging", 0, marketing, number)
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != uint32(4-i) || resp.Statuses[1].LimitRemaining != uint32(99-i) {
			t.Fatalf("call %d: %v", i+1, resp)
		}
	}
	resp := r.call(t, "messaging", 0, marketing, number)
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT ||
		resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
		resp.Statuses[1].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[1].LimitRemaining != 95 {
		t.Fatalf("call 6: %v", resp)
	}
	if !strings.Contains(hdrs(resp.ResponseHeadersToAdd), `"messaging.to_number";r=95;`) {
		t.Fatalf("headers: %s", hdrs(resp.ResponseHeadersToAdd))
	}
	// The denied call took nothing from to_number.
	resp = r.call(t, "messaging", 0, number)
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 94 {
		t.Fatalf("to_number after a denied call: %v", resp.Statuses[0])
	}
}

// testShadow: shadow mode never denies, and never blocks the others.
func testShadow(t *testing.T, r *running) {
	a, b := desc("service=auth", "user=user-a"), desc("service=auth", "user=user-b")
	for i := range 25 {
		resp := r.call(t, "example6", 0, a)
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("shadow call %d: %v", i+1, resp)
		}
		if len(resp.ResponseHeadersToAdd) != 0 {
			t.Fatalf("shadow descriptors in headers: %s", hdrs(resp.ResponseHeadersToAdd))
		}
		if want := uint32(max(0, 9-i)); resp.Statuses[0].LimitRemaining != want {
			t.Fatalf("shadow call %d: remaining %d, want %d", i+1, resp.Statuses[0].LimitRemaining, want)
		}
	}
	for i := range 20 {
		resp := r.call(t, "example6", 0, a, b)
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[1].LimitRemaining != uint32(19-i) {
			t.Fatalf("call %d with a spent shadow limit: %v", i+1, resp)
		}
	}
	if resp := r.call(t, "example6", 0, a, b); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("user-b past 20: %v", resp)
	}
}

// testHits: hits_addend is the cost; the descriptor's own wins.
func testHits(t *testing.T, r *running) {
	d := desc("remote_address=10.1.0.1")
	if resp := r.call(t, "edge_proxy_per_ip", 3, d); resp.Statuses[0].LimitRemaining != 7 {
		t.Fatalf("hits_addend 3: %v", resp.Statuses[0])
	}
	d.HitsAddend = wrapperspb.UInt64(5)
	if resp := r.call(t, "edge_proxy_per_ip", 3, d); resp.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("descriptor hits_addend 5: %v", resp.Statuses[0])
	}
	if resp := r.call(t, "edge_proxy_per_ip", 3, d); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("5 of 2: %v", resp)
	}
	d.HitsAddend = wrapperspb.UInt64(11)
	resp := r.call(t, "edge_proxy_per_ip", 0, d)
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("cost 11 > burst 10: %v", resp)
	}
	// Negative hits give back.
	d.HitsAddend, d.IsNegativeHits = wrapperspb.UInt64(4), true
	if resp := r.call(t, "edge_proxy_per_ip", 0, d); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("refund 4: %v", resp.Statuses[0])
	}
	// Two descriptors of one bucket add up.
	e := desc("remote_address=10.1.0.2")
	if resp := r.call(t, "edge_proxy_per_ip", 4, e, e); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[1].LimitRemaining != 2 {
		t.Fatalf("4+4: %v", resp)
	}
	if resp := r.call(t, "edge_proxy_per_ip", 6, e, e); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("6+6 > burst: %v", resp)
	}
	// Denied by another descriptor: what the bucket still holds, untaken.
	f := desc("remote_address=10.1.0.3")
	resp = r.call(t, "edge_proxy_per_ip", 3, f, f, desc("remote_address=50.0.0.5"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 10 || resp.Statuses[1].LimitRemaining != 10 {
		t.Fatalf("3+3 beside a blocked descriptor: %v", resp)
	}
}

// testKinds: no limit, unknown domains, unlimited, blocked, replaces.
func testKinds(t *testing.T, r *running) {
	for _, c := range []struct {
		domain string
		d      *ratelimitv3.RateLimitDescriptor
	}{{"nope", desc("a=b")}, {"mongo_cps", desc("database=other")}, {"example4", desc("key=value")}} {
		resp := r.call(t, c.domain, 0, c.d)
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil || len(resp.ResponseHeadersToAdd) != 0 {
			t.Fatalf("%s %v: %v, want OK without a limit", c.domain, c.d, resp)
		}
	}
	resp := r.call(t, "internal", 0, desc("ldap=x"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != math.MaxUint32 {
		t.Fatalf("unlimited: %v", resp)
	}
	resp = r.call(t, "edge_proxy_per_ip", 0, desc("remote_address=50.0.0.5"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("requests_per_unit 0: %v", resp)
	}
	// Example 7: the replacing limit applies, the replaced one is
	// neither applied nor charged.
	one, two := desc("key_1=value_1", "user=bkthomps"), desc("key_2=value_2", "user=bkthomps")
	for i := range 10 {
		resp := r.call(t, "example7", 0, one, two)
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].LimitRemaining != uint32(9-i) {
			t.Fatalf("replaces, call %d: %v", i+1, resp)
		}
	}
	if resp := r.call(t, "example7", 0, one); resp.Statuses[0].LimitRemaining != 4 || resp.Statuses[0].CurrentLimit.GetName() != "specific_limit" {
		t.Fatalf("replaced limit charged: %v", resp.Statuses[0])
	}
	// A request's own limit override.
	o := desc("database=users")
	o.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if resp := r.call(t, "mongo_cps", 0, o); resp.OverallCode != want {
			t.Fatalf("override, call %d: %v, want %v", i+1, resp, want)
		}
	}
}

func TestBadRequests(t *testing.T) {
	r := serve(t, memstore.New(), loadReadme(t), false)
	many := make([]*ratelimitv3.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("a=b")
	}
	bad := desc("a=b")
	bad.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2}
	for _, c := range []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{&rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a=b")}}, "rate limit domain must not be empty"},
		{&rlsv3.RateLimitRequest{Domain: "d"}, "rate limit descriptor list must not be empty"},
		{&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a=b"), {}}}, "descriptors[1]: no entries"},
		{&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a=b", "=c")}}, "descriptors[0].entries[1]: empty key"},
		{&rlsv3.RateLimitRequest{Domain: "d", Descriptors: many}, "65 descriptors: at most 64 per request"},
		{&rlsv3.RateLimitRequest{Domain: "mongo_cps", Descriptors: []*ratelimitv3.RateLimitDescriptor{bad}}, "descriptors[0].limit: unknown unit UNKNOWN"},
	} {
		_, err := r.client.ShouldRateLimit(context.Background(), c.req)
		if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || st.Message() != c.want {
			t.Errorf("%v: %v, want InvalidArgument %q", c.req, err, c.want)
		}
	}
}

// down is a store that has failed.
type down struct{}

var errDown = errors.New("connection refused")

func (down) Apply(context.Context, bucket.Op, time.Time, []bucket.Prepared, []bucket.Result) error {
	return errDown
}

func (down) Caps() store.Caps { return store.Caps{} }

func (down) Reset(context.Context, string) error { return errDown }

func TestStoreDown(t *testing.T) {
	r := serve(t, down{}, loadReadme(t), false)
	_, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge_proxy_per_ip", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address=1")}})
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "connection refused") {
		t.Fatalf("store down: %v, want Unavailable (Envoy then applies its failure_mode_deny)", err)
	}
	// No store call at all for what needs none.
	if resp := r.call(t, "internal", 0, desc("ldap=x")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("unlimited with the store down: %v", resp)
	}
}

func TestHealthAndReflection(t *testing.T) {
	for _, reflect := range []bool{false, true} {
		r := serve(t, memstore.New(), nil, reflect)
		h := healthpb.NewHealthClient(r.conn)
		for _, svc := range []string{"", ServiceName} {
			resp, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("health %q: %v %v", svc, resp, err)
			}
		}
		stream, err := reflectionpb.NewServerReflectionClient(r.conn).ServerReflectionInfo(context.Background())
		var resp *reflectionpb.ServerReflectionResponse
		if err == nil {
			// Send may fail with io.EOF once the server has refused the
			// stream: Recv then has the status.
			stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
			resp, err = stream.Recv()
		}
		if !reflect {
			if status.Code(err) != codes.Unimplemented {
				t.Fatalf("reflection off: %v %v, want Unimplemented", resp, err)
			}
			continue
		}
		if err != nil || !strings.Contains(resp.String(), ServiceName) {
			t.Fatalf("reflection on: %v %v", resp, err)
		}
	}
}

// TestShadowBlocked: a shadow limit of 0 requests is counted, never
// denies, and does not deny the others.
func TestShadowBlocked(t *testing.T) {
	c, err := Parse(File{Name: "s.yaml", Data: []byte(`domain: s
descriptors:
  - key: banned
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2}
`)})
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, memstore.New(), c, false)
	resp := r.call(t, "s", 0, desc("banned=x"), desc("user=u"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("%v", resp)
	}
}

// TestReplacedUnlimited: an unlimited descriptor stays unlimited (OK,
// remaining 4294967295) when another descriptor replaces it, as in
// envoyproxy/ratelimit, which marks it unlimited before applying replaces;
// a limited descriptor it replaces is neither applied nor charged.
func TestReplacedUnlimited(t *testing.T) {
	c, err := Parse(File{Name: "u.yaml", Data: []byte(`domain: u
descriptors:
  - key: vip
    rate_limit: {unlimited: true, name: vip}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5, name: user}
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: 2
      replaces: [{name: vip}, {name: user}]
`)})
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, memstore.New(), c, false)
	resp := r.call(t, "u", 0, desc("vip=a"), desc("user=u"), desc("tenant=t"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("%v", resp)
	}
	if st := resp.Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
		t.Errorf("the replaced unlimited descriptor: %v, want OK with remaining %d", st, uint32(math.MaxUint32))
	}
	if st := resp.Statuses[1]; st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 0 || st.CurrentLimit != nil {
		t.Errorf("the replaced limited descriptor: %v, want OK without a limit", st)
	}
	if st := resp.Statuses[2]; st.LimitRemaining != 1 || st.CurrentLimit.GetName() != "" {
		t.Errorf("the replacing descriptor: %v", st)
	}
}

func TestSwapKeepsBuckets(t *testing.T) {
	r := serve(t, memstore.New(), loadReadme(t), false)
	d := desc("remote_address=10.9.0.1")
	r.call(t, "edge_proxy_per_ip", 4, d)
	c, err := Parse(File{Name: "new.yaml", Data: []byte("domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10, burst: 20}\n")})
	if err != nil {
		t.Fatal(err)
	}
	r.svc.Swap(c)
	if resp := r.call(t, "edge_proxy_per_ip", 0, d); resp.Statuses[0].LimitRemaining != 5 || resp.Statuses[0].CurrentLimit.RequestsPerUnit != 10 {
		t.Fatalf("after swap: %v", resp.Statuses[0])
	}
	r.svc.Swap(nil)
	if resp := r.call(t, "edge_proxy_per_ip", 0, d); resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("after swap to nothing: %v", resp.Statuses[0])
	}
}

// gate is a memory store whose decisions wait until released.
type gate struct {
	*memstore.Store
	entered chan struct{}
	release chan struct{}
}

func (g gate) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	g.entered <- struct{}{}
	<-g.release
	return g.Store.Apply(ctx, op, at, items, results)
}

// TestGracefulShutdown: a call in flight when shutdown starts is
// answered; health turns NOT_SERVING at once.
func TestGracefulShutdown(t *testing.T) {
	g := gate{memstore.New(), make(chan struct{}), make(chan struct{})}
	svc := NewService(g, loadReadme(t))
	srv := NewServer(svc, false)
	conn, served := listen(t, srv)
	answered := make(chan error, 1)
	go func() {
		resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: "edge_proxy_per_ip", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address=1")}})
		if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
			err = fmt.Errorf("%v", resp)
		}
		answered <- err
	}()
	<-g.entered
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Shutdown(context.Background()) }()
	deadline := time.Now().Add(30 * time.Second) // generous: when is not what is tested
	for {
		resp, err := srv.Health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: ServiceName})
		if err == nil && resp.Status == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health during shutdown: %v %v", resp, err)
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-stopped:
		t.Fatalf("shutdown returned %v with a call in flight", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(g.release)
	if err := <-answered; err != nil {
		t.Fatalf("call in flight: %v", err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// observerFunc is an engine.Observer that hears only decisions, as
// (limit, shadow, outcome).
type observerFunc func(limit string, shadow bool, outcome string)

func (f observerFunc) Decision(limit string, mode rules.Mode, event engine.Event) {
	f(limit, mode == rules.Shadow, string(event))
}
func (observerFunc) StoreError(error)                     {}
func (observerFunc) StoreLatency(time.Duration)           {}
func (observerFunc) BreakerState(string)                  {}
func (observerFunc) Tokens(string, engine.Event, float64) {}

func TestObserver(t *testing.T) {
	var mu sync.Mutex
	var got []string
	obs := observerFunc(func(limit string, shadow bool, outcome string) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("%s shadow=%t %s", limit, shadow, outcome))
	})
	c := loadReadme(t)
	svc := NewService(memstore.New(), c, engine.WithObserver(obs))
	call := func(domain string, ds ...*ratelimitv3.RateLimitDescriptor) {
		if _, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}); err != nil {
			t.Fatal(err)
		}
	}
	marketing, number := desc("message_type=marketing", "to_number=1"), desc("to_number=1")
	for range 6 {
		call("messaging", marketing, number)
	}
	call("example6", desc("service=s", "user=user-a"))
	call("internal", desc("ldap=x"), desc("nothing=here"))
	want := []string{
		"messaging.message_type_marketing.to_number shadow=false allowed", "messaging.to_number shadow=false allowed",
		"messaging.message_type_marketing.to_number shadow=false denied", "messaging.to_number shadow=false not_taken",
		"example6.service.user_user-a shadow=true allowed",
		"internal.ldap shadow=false unlimited",
	}
	if len(got) != 14 || strings.Join(got[8:], "\n") != strings.Join(want[:2], "\n")+"\n"+strings.Join(want[2:], "\n") {
		t.Fatalf("observed:\n%s", strings.Join(got, "\n"))
	}

	down := NewService(down{}, c, engine.WithObserver(obs))
	got = nil
	if _, err := down.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*ratelimitv3.RateLimitDescriptor{number}}); err == nil {
		t.Fatal("no error from a failing store")
	}
	if len(got) != 1 || got[0] != "messaging.to_number shadow=false error" {
		t.Fatalf("observed %q", got)
	}
}

// TestManyDescriptors: descriptors of one bucket add up, past the few a
// scan handles.
func TestManyDescriptors(t *testing.T) {
	svc := NewService(memstore.New(), loadReadme(t))
	var ds []*ratelimitv3.RateLimitDescriptor
	for i := range 12 {
		ds = append(ds, desc(fmt.Sprintf("remote_address=10.3.0.%d", i)))
	}
	ds = append(ds, ds[0], ds[11])
	resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge_proxy_per_ip", Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range resp.Statuses {
		want := uint32(9)
		if i == 0 || i == 11 || i >= 12 {
			want = 8
		}
		if st.LimitRemaining != want {
			t.Fatalf("status %d: remaining %d, want %d", i, st.LimitRemaining, want)
		}
	}
}

// TestOverrideNames: a limit a request sets itself is named by its domain
// alone, in metrics and headers, so that clients sending many descriptor
// values cannot grow the metrics without bound; each value still has its
// own bucket.
func TestOverrideNames(t *testing.T) {
	names := map[string]int{}
	var mu sync.Mutex
	obs := observerFunc(func(limit string, shadow bool, outcome string) {
		mu.Lock()
		defer mu.Unlock()
		names[limit]++
	})
	svc := NewService(memstore.New(), loadReadme(t), engine.WithObserver(obs))
	for i := range 300 {
		d := desc(fmt.Sprintf("database=%d-%s", i, strings.Repeat("v", 2000)))
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
		resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "mongo_cps", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("value %d, its own bucket's first request: %v", i, resp.OverallCode)
		}
		for _, h := range resp.ResponseHeadersToAdd {
			if len(h.Value) > 200 {
				t.Fatalf("header %s carries the descriptor's value: %d bytes", h.Key, len(h.Value))
			}
		}
	}
	if len(names) != 1 || names["mongo_cps"+OverrideSuffix] != 300 {
		t.Fatalf("names observed: %v, want only %q", names, "mongo_cps"+OverrideSuffix)
	}
}
