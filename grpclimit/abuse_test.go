package grpclimit_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// TestAbusiveMetadata: metadata a client controls, however odd, keys a
// bucket of its own and never a huge key or header: a thousand values of
// the key (hashed, one bucket for that list), binary "-bin" values with
// NUL bytes, forwarding headers from an untrusted peer, bogus and
// oversized bearer tokens (no claims: a jwt-keyed rule does not apply).
func TestAbusiveMetadata(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{`+noJitter+` "jwt": {"hmac_secret_env": "TEST_JWT_SECRET"}, "rules": [
		{"name": "by-key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 2}},
		{"name": "by-bin", "limit_keys": ["header:x-tenant-bin"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 2}},
		{"name": "by-sub", "limit_keys": ["jwt:sub"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 2}},
		{"name": "by-ip", "limit_keys": ["ip:address"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 1000}}]}`))

	many := make([]string, 0, 2000)
	for i := range 1000 {
		many = append(many, "x-api-key", strings.Repeat("k", i%50)+"|\\")
	}
	if n := e.exhaust(e.client, many...); n != 2 {
		t.Errorf("a thousand x-api-key values: %d allowed, want the burst of one bucket (2)", n)
	}
	for _, v := range []string{"\x00", "\x00\x00", "\xff|\\"} {
		if n := e.exhaust(e.client, "x-tenant-bin", v); n != 2 {
			t.Errorf("x-tenant-bin %q: %d allowed, want 2 (a bucket of its own)", v, n)
		}
	}
	// Bogus tokens: none has claims, so by-sub never applies; by-ip does.
	for _, tok := range []string{"Bearer x.y.z", "Bearer " + strings.Repeat("a", 17<<10), "Basic Zm9vOmJhcg==", "Bearer "} {
		a := e.check(e.client, "authorization", tok)
		if a.code() != codes.OK || strings.Contains(a.get("ratelimit-policy"), "by-sub") {
			t.Errorf("authorization %.20q: %v, policy %q", tok, a.st, a.get("ratelimit-policy"))
		}
	}
	// x-forwarded-for from an untrusted peer (no trusted_proxies) changes
	// nothing: every call so far and these are one by-ip bucket.
	var xff []string
	for i := range 500 {
		xff = append(xff, "x-forwarded-for", "203.0.113."+string(rune('0'+i%10)))
	}
	a := e.check(e.client, xff...)
	if a.code() != codes.OK || !strings.Contains(a.get("ratelimit"), `"by-ip";r=`) {
		t.Fatalf("many x-forwarded-for: %v %v", a.st, a.md)
	}
	for _, vs := range a.md {
		for _, v := range vs {
			if len(v) > 512 {
				t.Errorf("response metadata of %d bytes", len(v))
			}
		}
	}
}

// stallStore blocks every call on a key holding "stall" until the call's
// context ends, and says when one has begun.
type stallStore struct {
	store.Store
	began chan struct{}
}

func (s *stallStore) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if len(items) == 1 && strings.Contains(items[0].Key, "stall") {
		s.began <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Apply(ctx, op, at, items, results)
}

// Caps are the store's, but not InProcess: it stands for a store on a
// server, whose calls get a deadline.
func (s *stallStore) Caps() store.Caps {
	c := s.Store.Caps()
	c.InProcess = false
	return c
}

// TestCancelledCallsDoNotTripBreaker: a client that cancels its calls
// while the store works on them is not the store failing: however many
// it cancels, the circuit breaker stays closed, so the calls of others
// are still decided by the store (not waved through by on_error).
func TestCancelledCallsDoNotTripBreaker(t *testing.T) {
	ms := memstore.New()
	t.Cleanup(func() { ms.Close() })
	st := &stallStore{Store: ms, began: make(chan struct{})}
	e := newEnv(t, st, parse(t, `{`+noJitter+` "rules": [
		{"name": "k", "limit_keys": ["header:x-user"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 2}}]}`))
	for i := range 30 { // the breaker's default opens at 5 failures
		ctx, cancel := context.WithCancel(e.ctx("x-user", "stall"))
		done := make(chan error, 1)
		go func() {
			_, err := e.client.Check(ctx, &healthpb.HealthCheckRequest{})
			done <- err
		}()
		<-st.began
		cancel()
		if err := <-done; status.Code(err) != codes.Canceled {
			t.Fatalf("cancelled call %d: %v", i, err)
		}
	}
	if s := e.lim.BreakerState(); s != "closed" {
		t.Errorf("breaker %s after cancelled calls, want closed", s)
	}
	if n := e.exhaust(e.client, "x-user", "alice"); n != 2 {
		t.Errorf("alice after the cancelled calls: %d allowed, want the store's burst (2)", n)
	}
}

// TestDeniedStreamFlood: a flood of streams over the limit is denied as
// each opens; none reaches the service, and the server holds no goroutine
// for them once they are answered.
func TestDeniedStreamFlood(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{`+noJitter+` "rules": [
		{"name": "streams", "limit_keys": ["path"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}}]}`))
	if a, _ := e.watch(e.client); a.code() != codes.OK {
		t.Fatalf("first stream: %v", a.st)
	}
	base := runtime.NumGoroutine()
	var wg sync.WaitGroup
	var mu sync.Mutex
	codesSeen := map[codes.Code]int{}
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				ctx, cancel := context.WithTimeout(context.Background(), teststores.Timeout)
				s, err := e.client.Watch(ctx, &healthpb.HealthCheckRequest{})
				if err == nil {
					_, err = s.Recv()
				}
				cancel()
				mu.Lock()
				codesSeen[status.Code(err)]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if codesSeen[codes.ResourceExhausted] != 800 || e.hits.Load() != 1 {
		t.Fatalf("codes %v, %d streams served: want 800 ResourceExhausted and 1", codesSeen, e.hits.Load())
	}
	// The server's stream goroutines end as their answers go: wait for
	// that, with a generous deadline (a count, not a duration, is checked).
	deadline := time.Now().Add(teststores.Timeout)
	for runtime.NumGoroutine() > base+4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base+4 {
		t.Errorf("%d goroutines after the flood, %d before", n, base)
	}
}
