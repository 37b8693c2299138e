package pace_test

import (
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// TestDripConcurrencyRule: drip's own middleware with a concurrency rule
// of 2 slots (lease TTL 2 minutes) before a handler that takes 2 s. Six
// paced requests at once all succeed, as they would from a plain client
// that retries: the transport keeps 2 in flight, no more and no fewer once
// it has heard the limit, and never waits for the lease TTL, which is not
// a window to wait out.
func TestDripConcurrencyRule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set, err := rules.Parse([]byte(`{"rules": [
		  {"name": "slots", "limit_keys": ["global"], "algorithm": "concurrency",
		   "algorithm_config": {"max_in_flight": 2, "lease_ttl": "2m"}}]}`), "rules.json")
		if err != nil {
			t.Fatal(err)
		}
		ms := memstore.New(memstore.WithSweep(0))
		lim := httplimit.New(ms, set, engine.WithLogger(slog.New(slog.DiscardHandler)))
		t.Cleanup(func() { lim.Close(); ms.Close() })
		var mu sync.Mutex
		inflight, peak, refused := 0, 0, 0
		work := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			inflight++
			peak = max(peak, inflight)
			mu.Unlock()
			time.Sleep(2 * time.Second)
			mu.Lock()
			inflight--
			mu.Unlock()
		}))
		c, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rec := &status{ResponseWriter: w}
			work.ServeHTTP(rec, r)
			if rec.code == http.StatusTooManyRequests {
				mu.Lock()
				refused++
				mu.Unlock()
			}
		}))
		start := time.Now()
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Go(func() {
				if code, err := get(c, "http://api.example/"); err != nil || code != http.StatusOK {
					t.Errorf("request %d: %d, %v", i, code, err)
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		t.Logf("6 requests in %v of virtual time, at most %d in flight, %d refused", elapsed, peak, refused)
		if peak != 2 || refused > 0 {
			t.Errorf("%d in flight at once and %d refused, want 2 (both slots used) and none", peak, refused)
		}
		// A probe alone, then the other five two at a time: 4 rounds.
		if elapsed > 8*time.Second {
			t.Errorf("6 requests took %v, want 8 s: a probe, then both slots in use", elapsed)
		}
	})
}

// status records a response's status code.
type status struct {
	http.ResponseWriter
	code int
}

func (s *status) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}
