package grpclimit_test

import (
	"context"
	"io"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/grpclimit"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/store/memstore"
)

// usageHealth is a health service that reports a call's usage as the
// x-usage metadata the call asks for (its own x-want-usage), in a header
// (x-usage-in: header) or a trailer, and fails calls whose x-password is
// not "right" with Unauthenticated.
type usageHealth struct {
	healthpb.UnimplementedHealthServer
}

func (usageHealth) answer(ctx context.Context, set func(header bool, md metadata.MD)) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if u := md.Get("x-want-usage"); len(u) > 0 {
		set(len(md.Get("x-usage-in")) > 0, metadata.Pairs("x-usage", u[0]))
	}
	if p := md.Get("x-password"); len(p) == 0 || p[0] != "right" {
		return status.Error(codes.Unauthenticated, "wrong password")
	}
	return nil
}

func (h usageHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	err := h.answer(ctx, func(header bool, md metadata.MD) {
		if header {
			_ = grpc.SetHeader(ctx, md)
		} else {
			_ = grpc.SetTrailer(ctx, md)
		}
	})
	if err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h usageHealth) Watch(_ *healthpb.HealthCheckRequest, ss healthpb.Health_WatchServer) error {
	if err := ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
		return err
	}
	return h.answer(ss.Context(), func(header bool, md metadata.MD) {
		if header {
			_ = ss.SetHeader(md)
		} else {
			ss.SetTrailer(md)
		}
	})
}

func TestSettle(t *testing.T) {
	set := parse(t, `{"rules": [
	{"name": "usage", "limit_keys": ["header:x-tenant"], "cost_from_response": "trailer:x-usage",
	 "algorithm_config": {"rate": 1000, "period": "1h", "cost_source": "header:x-estimate", "default_cost": 100}},
	{"name": "usage-h", "limit_keys": ["header:x-tenant-h"], "cost_from_response": "header:x-usage",
	 "algorithm_config": {"rate": 1000, "period": "1h", "cost_source": "header:x-estimate", "default_cost": 100}},
	{"name": "logins", "limit_keys": ["header:x-user"], "count_status": [401],
	 "algorithm_config": {"rate": 3, "period": "1h"}}]}`)
	clock := testclock.New()
	ms := memstore.New(memstore.WithClock(clock.Now))
	t.Cleanup(func() { ms.Close() })
	lim := grpclimit.New(ms, set, engine.WithClock(clock.Now), engine.WithTimeout(teststores.Timeout))
	t.Cleanup(func() { lim.Close() })
	srv := grpc.NewServer(grpc.UnaryInterceptor(lim.UnaryInterceptor()), grpc.StreamInterceptor(lim.StreamInterceptor()))
	healthpb.RegisterHealthServer(srv, usageHealth{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := healthpb.NewHealthClient(conn)

	tokens := func(rule, v string) float64 {
		t.Helper()
		r, _ := set.Rule(rule)
		m, err := drip.Apply(context.Background(), ms, bucket.Peek, clock.Now(), drip.Request{Key: r.Key([]string{v}), Limit: r.Limit})
		if err != nil {
			t.Fatal(err)
		}
		return m.Decisions[0].Tokens
	}
	call := func(kv ...string) error {
		ctx := metadata.AppendToOutgoingContext(context.Background(), append(kv, "x-password", "right")...)
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	watch := func(kv ...string) error {
		ctx := metadata.AppendToOutgoingContext(context.Background(), append(kv, "x-password", "right")...)
		st, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		for {
			if _, err := st.Recv(); err == io.EOF {
				return nil
			} else if err != nil {
				return err
			}
		}
	}
	// Unary, usage in a trailer: 100 estimated, 30 used.
	if err := call("x-tenant", "a", "x-want-usage", "30"); err != nil {
		t.Fatal(err)
	}
	if got := tokens("usage", "a"); got != 970 {
		t.Errorf("unary trailer: %v, want 970", got)
	}
	// A stream, usage in its trailer: 100 estimated, 250 used.
	if err := watch("x-tenant", "b", "x-want-usage", "250"); err != nil {
		t.Fatal(err)
	}
	if got := tokens("usage", "b"); got != 750 {
		t.Errorf("stream trailer: %v, want 750", got)
	}
	// Usage in header metadata, read by a header: rule.
	if err := call("x-tenant-h", "c", "x-want-usage", "5", "x-usage-in", "header"); err != nil {
		t.Fatal(err)
	}
	if got := tokens("usage-h", "c"); got != 995 {
		t.Errorf("unary header: %v, want 995", got)
	}

	// count_status [401]: Unauthenticated calls count, OK ones do not.
	for range 5 {
		if err := call("x-user", "u"); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-user", "u", "x-password", "wrong")
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("failure %d: %v", i, err)
		}
	}
	if err := call("x-user", "u"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("after 3 failures: %v, want ResourceExhausted", err)
	}
}

func TestHTTPStatus(t *testing.T) {
	for c, want := range map[codes.Code]int{codes.OK: 200, codes.Unauthenticated: 401, codes.PermissionDenied: 403,
		codes.NotFound: 404, codes.ResourceExhausted: 429, codes.Internal: 500, codes.Unavailable: 503, codes.Code(99): 500} {
		if got := grpclimit.HTTPStatus(c); got != want {
			t.Errorf("%v: %d, want %d", c, got, want)
		}
	}
}
