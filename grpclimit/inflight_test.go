package grpclimit_test

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/grpclimit"
	"github.com/driplimit/drip/store/memstore"
)

// TestInFlight: a concurrency rule's slot is held while the handler runs
// and released when it returns: normally, with an error, by a panic (which
// goes on), or after the call was cancelled.
func TestInFlight(t *testing.T) {
	ms := memstore.New()
	t.Cleanup(func() { ms.Close() })
	lim := grpclimit.New(ms, parse(t, `{"rules": [{"name": "slots", "limit_keys": ["global"], "algorithm": "concurrency",
		"algorithm_config": {"max_in_flight": 1, "lease_ttl": "1h"}}]}`))
	t.Cleanup(func() { lim.Close() })
	intercept := lim.UnaryInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/pkg.Service/Method"}
	call := func(ctx context.Context, h grpc.UnaryHandler) error {
		_, err := intercept(ctx, nil, info, h)
		return err
	}
	ok := func(context.Context, any) (any, error) { return "ok", nil }
	wantFree := func(what string) {
		t.Helper()
		if err := call(context.Background(), ok); err != nil {
			t.Fatalf("after %s: %v, want the slot free", what, err)
		}
	}

	// While a call runs, another is denied.
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- call(context.Background(), func(context.Context, any) (any, error) {
			close(started)
			<-finish
			return nil, errors.New("handler failed")
		})
	}()
	<-started
	if err := call(context.Background(), ok); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("while the slot is held: %v, want ResourceExhausted", err)
	}
	close(finish)
	if err := <-done; err == nil || err.Error() != "handler failed" {
		t.Fatalf("the holder: %v", err)
	}
	wantFree("a handler that failed")

	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want the handler's panic to go on", v)
			}
		}()
		_ = call(context.Background(), func(context.Context, any) (any, error) { panic("boom") })
	}()
	wantFree("a panic")

	ctx, cancel := context.WithCancel(context.Background())
	_ = call(ctx, func(ctx context.Context, _ any) (any, error) {
		cancel()
		<-ctx.Done()
		return nil, ctx.Err()
	})
	wantFree("a cancelled call")
}
