package httplimit_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/store/memstore"
)

// TestQueueInFlight: behind a concurrency rule with max_wait, a request
// that finds every slot held waits: the release of the slot when a
// response ends lets it in at once; one whose client goes away while it
// waits leaves with a 429 and takes nothing; one whose wait runs out is
// answered 429.
func TestQueueInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		lim := httplimit.New(ms, parse(t, `{"rules": [{"name": "slots", "limit_keys": ["global"], "algorithm": "concurrency",
		  "max_wait": "1s", "algorithm_config": {"max_in_flight": 1}}]}`), engine.WithLogger(slog.New(slog.DiscardHandler)))
		defer lim.Close()
		hold := make(chan struct{})
		h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				<-hold
			}
		}))
		serve := func(ctx context.Context, path string) (int, time.Duration) {
			start := time.Now()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil).WithContext(ctx))
			return rec.Code, time.Since(start)
		}
		ctx := t.Context()
		held := make(chan int)
		go func() { code, _ := serve(ctx, "/hold"); held <- code }()
		synctest.Wait()
		gone, cancel := context.WithCancel(ctx)
		left := make(chan int)
		go func() { code, _ := serve(gone, "/"); left <- code }()
		waiter := make(chan time.Duration)
		go func() {
			code, d := serve(ctx, "/")
			if code != 200 {
				t.Errorf("the waiter: %d, want 200", code)
			}
			waiter <- d
		}()
		time.Sleep(10 * time.Millisecond)
		cancel()
		if code := <-left; code != http.StatusTooManyRequests {
			t.Errorf("the client that went away: %d, want 429", code)
		}
		time.Sleep(30 * time.Millisecond)
		close(hold)
		if code := <-held; code != 200 {
			t.Fatalf("the request that held the slot: %d", code)
		}
		if d := <-waiter; d != 40*time.Millisecond {
			t.Errorf("the waiter was served after %v, want 40ms (when the slot was released)", d)
		}
		hold = make(chan struct{})
		go func() { serve(ctx, "/hold"); held <- 0 }()
		synctest.Wait()
		if code, d := serve(ctx, "/"); code != http.StatusTooManyRequests || d != time.Second {
			t.Errorf("a waiter for a slot held throughout: %d after %v, want 429 after 1s", code, d)
		}
		close(hold)
		<-held
	})
}
