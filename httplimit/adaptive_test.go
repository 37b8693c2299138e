package httplimit_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/store/memstore"
)

// TestAdaptiveMiddleware: an adaptive rule through the middleware: at
// its limit a request is answered 503 (reason overloaded, naming its
// class of priority), the slot comes back when the handler returns, and
// the upstream's 503s shrink the limit.
func TestAdaptiveMiddleware(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set := parse(t, `{"rules": [{"name": "up", "limit_keys": ["global"], "algorithm": "adaptive",
		  "priority_from": "header:x-priority",
		  "algorithm_config": {"initial_limit": 10, "min_limit": 1, "max_limit": 10, "window": "10ms"}}]}`)
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		lim := httplimit.New(ms, set, engine.WithLogger(slog.New(slog.DiscardHandler)))
		defer lim.Close()
		release := make(chan struct{})
		h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Fail") != "" {
				time.Sleep(time.Millisecond)
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			<-release
		}))
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			})
		}
		synctest.Wait()
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Priority", "sheddable")
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("at the limit: %d, want 503", rec.Code)
		}
		var p httplimit.Problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Reason != "overloaded" || p.Priority != "sheddable" || rec.Header().Get("Drip-Priority") != "sheddable" {
			t.Fatalf("at the limit: %s (%v), Drip-Priority %q", rec.Body, err, rec.Header().Get("Drip-Priority"))
		}
		close(release)
		wg.Wait()
		if st := lim.Engine().Adaptive(); len(st) != 1 || st[0].InFlight != 0 || st[0].Limit != 10 {
			t.Fatalf("after the handlers returned: %+v", st)
		}
		// The upstream answers 503: the limit shrinks.
		for range 100 {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-Fail", "1")
			h.ServeHTTP(rec, req)
			time.Sleep(time.Millisecond)
		}
		if st := lim.Engine().Adaptive(); st[0].Limit > 2 {
			t.Fatalf("after the upstream answered 503s: limit %v, want it shrunk", st[0].Limit)
		}
	})
}

// TestAdaptiveClientGone: a client that hangs up teaches an adaptive
// rule nothing. Its handler answers as a proxy does when its client has
// gone (502, the upstream call cancelled): that is no drop, and the limit
// does not shrink. Before, each hang-up counted as the upstream failing,
// so a client could drive the limit down to min_limit for every other.
func TestAdaptiveClientGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set := parse(t, `{"rules": [{"name": "up", "limit_keys": ["global"], "algorithm": "adaptive",
		  "algorithm_config": {"initial_limit": 10, "min_limit": 1, "max_limit": 10, "window": "10ms"}}]}`)
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		lim := httplimit.New(ms, set, engine.WithLogger(slog.New(slog.DiscardHandler)))
		defer lim.Close()
		h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
			w.WriteHeader(http.StatusBadGateway)
		}))
		for range 100 {
			ctx, hangUp := context.WithCancel(t.Context())
			go func() {
				time.Sleep(time.Millisecond)
				hangUp()
			}()
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(ctx))
			time.Sleep(time.Millisecond)
		}
		if st := lim.Engine().Adaptive(); len(st) != 1 || st[0].InFlight != 0 || st[0].Limit != 10 {
			t.Fatalf("after 100 clients hung up: %+v, want the limit of 10 as it was", st)
		}
	})
}
