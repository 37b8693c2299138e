package grpclimit_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/grpclimit"
	"github.com/driplimit/drip/store/memstore"
)

// TestAdaptive: an adaptive rule through the interceptors: at its limit
// a call is UNAVAILABLE (reason OVERLOADED, its class in the ErrorInfo),
// and calls that end UNAVAILABLE shrink the limit.
func TestAdaptive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		lim := grpclimit.New(ms, parse(t, `{"rules": [{"name": "up", "limit_keys": ["global"], "algorithm": "adaptive",
		  "priority_from": "header:x-priority",
		  "algorithm_config": {"initial_limit": 10, "max_limit": 10, "window": "10ms"}}]}`))
		defer lim.Close()
		intercept := lim.UnaryInterceptor()
		info := &grpc.UnaryServerInfo{FullMethod: "/pkg.Service/Method"}
		release := make(chan struct{})
		for range 10 {
			go intercept(context.Background(), nil, info, func(context.Context, any) (any, error) {
				<-release
				return "ok", nil
			})
		}
		synctest.Wait()
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-priority", "batch"))
		_, err := intercept(ctx, nil, info, func(context.Context, any) (any, error) { return "ok", nil })
		st := status.Convert(err)
		if st.Code() != codes.Unavailable {
			t.Fatalf("at the limit: %v, want UNAVAILABLE", err)
		}
		found := false
		for _, d := range st.Proto().GetDetails() {
			found = found || (len(d.Value) > 0 && strings.Contains(string(d.Value), "OVERLOADED") && strings.Contains(string(d.Value), "batch"))
		}
		if !found {
			t.Fatalf("at the limit: no ErrorInfo with OVERLOADED and the class: %v", st.Proto().GetDetails())
		}
		close(release)
		synctest.Wait()
		for range 100 {
			intercept(context.Background(), nil, info, func(context.Context, any) (any, error) {
				time.Sleep(time.Millisecond)
				return nil, status.Error(codes.Unavailable, "overloaded upstream")
			})
		}
		if l := lim.Engine().Adaptive()[0].Limit; l > 2 {
			t.Fatalf("after calls that ended UNAVAILABLE: limit %v, want it shrunk", l)
		}
	})
}

// TestAdaptiveCallerGone: a caller that cancels its call teaches an
// adaptive rule nothing, whatever the handler then returns (here
// UNAVAILABLE, as a proxy's cut call to its upstream may be): the limit
// does not shrink. Before, each cancelled call counted as the upstream
// failing.
func TestAdaptiveCallerGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		lim := grpclimit.New(ms, parse(t, `{"rules": [{"name": "up", "limit_keys": ["global"], "algorithm": "adaptive",
		  "algorithm_config": {"initial_limit": 10, "max_limit": 10, "window": "10ms"}}]}`))
		defer lim.Close()
		intercept := lim.UnaryInterceptor()
		info := &grpc.UnaryServerInfo{FullMethod: "/pkg.Service/Method"}
		for range 100 {
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				time.Sleep(time.Millisecond)
				cancel()
			}()
			intercept(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
				<-ctx.Done()
				return nil, status.Error(codes.Unavailable, "upstream call cut")
			})
			time.Sleep(time.Millisecond)
		}
		if st := lim.Engine().Adaptive(); st[0].Limit != 10 || st[0].InFlight != 0 {
			t.Fatalf("after 100 callers cancelled: %+v, want the limit of 10 as it was", st[0])
		}
	})
}
