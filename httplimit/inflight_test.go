package httplimit_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/store/memstore"
)

// inflightRules: one slot per client path, and a token bucket beside it
// on every request, so that a request matches both kinds of rule.
const inflightRules = `{"rules": [
	{"name": "slots-{id}", "limit_keys": ["global"], "algorithm": "concurrency",
	 "algorithm_config": {"max_in_flight": MAX, "lease_ttl": "1m"}},
	{"name": "rate-{id}", "limit_keys": ["global"], "algorithm_config": {"rps": 1, "burst": 100000}}
]}`

func inflightLimiter(t *testing.T, store interface{}, max string) *httplimit.Limiter {
	t.Helper()
	src := strings.NewReplacer("MAX", max, "{id}", runID()).Replace(inflightRules)
	var lim *httplimit.Limiter
	opts := []httplimit.Option{engine.WithTimeout(teststores.Timeout), engine.WithLogger(slog.New(slog.DiscardHandler))}
	switch st := store.(type) {
	case nil:
		ms := memstore.New()
		t.Cleanup(func() { ms.Close() })
		lim = httplimit.New(ms, parse(t, src), opts...)
	case teststores.Store:
		lim = httplimit.New(st.Open(t), parse(t, src), opts...)
	}
	t.Cleanup(func() { lim.Close() })
	return lim
}

func serve(h http.Handler, ctx context.Context) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	return rec
}

// TestInFlightReleasedWhenHandlerReturns: a request holds its slot while
// its handler runs, a second one is denied meanwhile (429, reason
// concurrency_exceeded), and the slot is back once the first returns.
func TestInFlightReleasedWhenHandlerReturns(t *testing.T) {
	lim := inflightLimiter(t, nil, "1")
	started, finish := make(chan struct{}), make(chan struct{})
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			close(started)
			<-finish
		}
		io.WriteString(w, "ok")
	}))
	done := make(chan *httptest.ResponseRecorder)
	go func() {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Block", "1")
		h.ServeHTTP(rec, req)
		done <- rec
	}()
	<-started
	rec := serve(h, context.Background())
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "concurrency_exceeded") {
		t.Fatalf("while the slot is held: %d %s, want 429 concurrency_exceeded", rec.Code, rec.Body)
	}
	// The slots are a quota of concurrent requests, without a window; a
	// slot frees when a request ends, so the 429 asks for a short wait,
	// not the lease TTL (1 s and its jitter: 1 or 2 s).
	slots := sfv.String(lim.Rules().Rules[0].Name)
	h429 := rec.Header()
	ra := h429.Get("Retry-After")
	if ra != "1" && ra != "2" {
		t.Errorf("Retry-After %q, want 1 or 2 (a second and its jitter), not the lease TTL", ra)
	}
	for k, want := range map[string]string{
		"RateLimit-Policy":    slots + `;q=1;qu="concurrent-requests", `,
		"RateLimit":           slots + ";r=0;t=" + ra + ", ",
		"RateLimit-Limit":     "1",
		"RateLimit-Remaining": "0",
		"RateLimit-Reset":     ra,
	} {
		if got := h429.Get(k); !strings.HasPrefix(got, want) {
			t.Errorf("on the 429, %s: %q, want %q...", k, got, want)
		}
	}
	if err := sfv.CheckHeaders(h429.Get); err != nil {
		t.Error(err)
	}
	close(finish)
	first := <-done
	if first.Code != http.StatusOK {
		t.Fatalf("the holder: %d", first.Code)
	}
	// On the holder's 200, the slots (none left) are the tightest limit:
	// no window to wait out, so no t and no RateLimit-Reset.
	h200 := first.Header()
	if got, want := h200.Get("RateLimit"), slots+";r=0, "; !strings.HasPrefix(got, want) {
		t.Errorf("on the 200, RateLimit: %q, want %q...", got, want)
	}
	if got := h200.Get("RateLimit-Remaining"); got != "0" {
		t.Errorf("on the 200, RateLimit-Remaining: %q, want 0", got)
	}
	if got, ok := h200["Ratelimit-Reset"]; ok {
		t.Errorf("on the 200, RateLimit-Reset %q for a concurrency limit", got)
	}
	if err := sfv.CheckHeaders(h200.Get); err != nil {
		t.Error(err)
	}
	if rec := serve(h, context.Background()); rec.Code != http.StatusOK {
		t.Fatalf("after the holder returned: %d %s, want 200", rec.Code, rec.Body)
	}
}

// TestInFlightReleasedOnPanic: a handler that panics gives its slot back,
// and the panic still reaches the server.
func TestInFlightReleasedOnPanic(t *testing.T) {
	lim := inflightLimiter(t, nil, "1")
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic(http.ErrAbortHandler)
		}
	}))
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Errorf("recovered %v, want the handler's panic to go on", v)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/panic", nil))
	}()
	if rec := serve(h, context.Background()); rec.Code != http.StatusOK {
		t.Fatalf("after a panic: %d %s, want 200 (the slot released)", rec.Code, rec.Body)
	}
}

// TestInFlightReleasedOnCancel: a client that goes away ends its
// request's context; the handler gives up and the slot is released on a
// context of its own, although the request's is cancelled.
func TestInFlightReleasedOnCancel(t *testing.T) {
	lim := inflightLimiter(t, nil, "1")
	started := make(chan struct{})
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Wait") != "" {
			close(started)
			<-r.Context().Done()
		}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		req := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
		req.Header.Set("X-Wait", "1")
		h.ServeHTTP(httptest.NewRecorder(), req)
		close(done)
	}()
	<-started
	if rec := serve(h, context.Background()); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("while held: %d, want 429", rec.Code)
	}
	cancel()
	<-done
	if rec := serve(h, context.Background()); rec.Code != http.StatusOK {
		t.Fatalf("after the client went away: %d %s, want 200", rec.Code, rec.Body)
	}
}

// TestInFlightStores: 64 concurrent requests through the middleware on
// every store never have more than max_in_flight handlers running.
func TestInFlightStores(t *testing.T) {
	for _, st := range teststores.Shared() {
		t.Run(st.Name, func(t *testing.T) {
			const max, workers, each = 3, 64, 4
			lim := inflightLimiter(t, st, "3")
			var running, peak, served atomic.Int64
			h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := running.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				served.Add(1)
				running.Add(-1)
			}))
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						rec := serve(h, context.Background())
						if rec.Code != http.StatusOK && rec.Code != http.StatusTooManyRequests {
							t.Errorf("status %d: %s", rec.Code, rec.Body)
						}
					}
				}()
			}
			wg.Wait()
			if p := peak.Load(); p > max {
				t.Errorf("%d handlers at once, more than max_in_flight %d", p, max)
			}
			if s := served.Load(); s < max {
				t.Errorf("only %d requests served", s)
			}
			// Every slot is back.
			if rec := serve(h, context.Background()); rec.Code != http.StatusOK {
				t.Errorf("after the load: %d %s, want 200", rec.Code, rec.Body)
			}
		})
	}
}
