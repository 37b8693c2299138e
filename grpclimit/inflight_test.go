package grpclimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/grpclimit"
	"github.com/driplimit/drip/internal/sfv"
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

// TestStreamSlotsMetadata: a concurrency rule on streams shows in the
// header metadata as a quota of concurrent requests, without a window
// (no t and no ratelimit-reset while it allows); a stream it denies is
// told to retry in a second (RetryInfo and retry-after), not when the
// open stream's lease would expire.
func TestStreamSlotsMetadata(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{`+noJitter+` "rules": [
		{"name": "streams", "limit_keys": ["path"], "algorithm": "concurrency",
		 "algorithm_config": {"max_in_flight": 1, "lease_ttl": "1h"}}]}`))
	for i, c := range []struct {
		code codes.Code
		want map[string]string
	}{
		{codes.OK, map[string]string{"ratelimit-policy": `"streams";q=1;qu="concurrent-requests"`,
			"ratelimit": `"streams";r=0`, "ratelimit-limit": "1", "ratelimit-remaining": "0", "ratelimit-reset": "", "retry-after": ""}},
		{codes.ResourceExhausted, map[string]string{"ratelimit-policy": `"streams";q=1;qu="concurrent-requests"`,
			"ratelimit": `"streams";r=0;t=1`, "ratelimit-limit": "1", "ratelimit-remaining": "0", "ratelimit-reset": "1", "retry-after": "1"}},
	} {
		a, _ := e.watch(e.client) // the first stream stays open
		if a.code() != c.code {
			t.Fatalf("stream %d: %v, want %v", i+1, a.st, c.code)
		}
		for k, v := range c.want {
			if got := a.get(k); got != v {
				t.Errorf("stream %d: %s %q, want %q", i+1, k, got, v)
			}
		}
		if err := sfv.CheckHeaders(func(k string) string { return a.get(strings.ToLower(k)) }); err != nil {
			t.Errorf("stream %d: %v", i+1, err)
		}
		if c.code == codes.ResourceExhausted {
			if ri, _ := details(t, a.st); ri == nil || ri.RetryDelay.AsDuration() != time.Second {
				t.Errorf("RetryInfo %v, want 1s", ri)
			}
		}
	}
}
