package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip/internal/testkit/pipenet"
	"github.com/driplimit/drip/pace"
	"github.com/driplimit/drip/store/memstore"
)

// wire counts the statuses a transport sees, under pace's retries.
type wire struct {
	base     http.RoundTripper
	ok, over atomic.Int64
}

func (w *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := w.base.RoundTrip(r)
	if err == nil {
		if resp.StatusCode == http.StatusTooManyRequests {
			w.over.Add(1)
		} else {
			w.ok.Add(1)
		}
	}
	return resp, err
}

// TestPaceThroughGateway runs drip serve as a gateway, with the memory
// store and a rules file, and clients that pace themselves with
// pace.Transport from its RateLimit headers: 40 goroutines send 400
// requests under one API key. In steady state the server refuses none of
// them, and the throughput is the rule's rate. Server and clients share a
// synctest bubble (virtual time) and talk over an in-memory network; the
// upstream is a real server outside the bubble that closes each
// connection (an idle connection would hold the bubble's clock still).
func TestPaceThroughGateway(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "ok\n")
	}))
	defer upstream.Close()
	for _, tc := range []struct {
		name, rule string
		second     string        // a second rule on the same key, if any
		rate       float64       // requests a second the client should reach in steady state
		burst      int64         // what it allows at once at the start
		span       time.Duration // the virtual time 400 requests should take
	}{
		// 20 at once, then 20 every 2 s (t is whole seconds: full again
		// 2 s after the last take): the last 20 go at 38 s.
		{"token_bucket", `"algorithm": "token_bucket", "algorithm_config": {"rps": 10, "burst": 20}`, "", 10, 20, 38 * time.Second},
		// A burst that refills in half a second: t rounds up to 1 s, so
		// the client sends 5 a second, half the rate (the headers give no
		// finer time); still no 429. The last 5 go at 79 s.
		{"token_bucket_small_burst", `"algorithm": "token_bucket", "algorithm_config": {"rps": 10, "burst": 5}`, "", 5, 5, 79 * time.Second},
		// 50 per 10 s window, on the epoch's grid: the 8th window opens at 70 s.
		{"fixed_window", `"algorithm": "fixed_window", "algorithm_config": {"rate": 50, "period": "10s", "start": 0}`, "", 5, 50, 70 * time.Second},
		// Two rules, so two policies in the headers: the token bucket above
		// and 30 per 10 s window. Each window: 20 at once (the bucket), 10
		// more 2 s later (the window's rest, not the bucket's 20); the
		// 14th window opens at 130 s and sends the last 10.
		{"two_policies", `"algorithm": "token_bucket", "algorithm_config": {"rps": 10, "burst": 20}`,
			`"algorithm": "fixed_window", "algorithm_config": {"rate": 30, "period": "10s", "start": 0}`, 3, 30, 130 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rules.json")
			rules := fmt.Sprintf(`{"name": "api", "limit_keys": ["header:x-api-key"], %s}`, tc.rule)
			if tc.second != "" {
				rules += fmt.Sprintf(`, {"name": "window", "limit_keys": ["header:x-api-key"], %s}`, tc.second)
			}
			rules = `{"rules": [` + rules + `]}`
			if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
				t.Fatal(err)
			}
			synctest.Test(t, func(t *testing.T) {
				store := memstore.New(memstore.WithSweep(0))
				defer store.Close()
				s, err := New(Config{Listen: "127.0.0.1:0", AdminListen: "off", Rules: path, Upstream: upstream.URL,
					WatchEvery: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, store)
				if err != nil {
					t.Fatal(err)
				}
				ln := pipenet.Listen()
				for _, l := range s.listeners {
					if l.name == "gateway" {
						l.ln = ln // bound already: Serve serves the in-memory network
					}
				}
				ctx, cancel := context.WithCancel(context.Background())
				served := make(chan error, 1)
				go func() { served <- s.Serve(ctx) }()
				base := &http.Transport{DialContext: ln.Dial}
				w := &wire{base: base}
				client := &http.Client{Transport: pace.New(w)}

				start := time.Now()
				var wg sync.WaitGroup
				for range 40 {
					wg.Go(func() {
						for range 10 {
							req, _ := http.NewRequest(http.MethodGet, "http://api.example/v1/items", nil)
							req.Header.Set("X-Api-Key", "k1")
							resp, err := client.Do(req)
							if err != nil {
								t.Error(err)
								return
							}
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if resp.StatusCode != http.StatusOK {
								t.Errorf("status %d", resp.StatusCode)
							}
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				rate := float64(w.ok.Load()-tc.burst) / elapsed.Seconds()
				t.Logf("%d answered, %d refused (429) on the wire, in %v of virtual time: %.2f requests/s after the first burst (want about %g/s)",
					w.ok.Load(), w.over.Load(), elapsed, rate, tc.rate)
				if w.over.Load() != 0 {
					t.Errorf("drip serve refused %d requests; a paced client should see none", w.over.Load())
				}
				if w.ok.Load() != 400 {
					t.Errorf("%d answered, want 400", w.ok.Load())
				}
				if elapsed < tc.span || elapsed > tc.span+time.Second {
					t.Errorf("400 requests took %v, want %v (the rule's rate) and under a second more", elapsed, tc.span)
				}
				cancel()
				if err := <-served; err != nil {
					t.Errorf("Serve: %v", err)
				}
				base.CloseIdleConnections()
			})
		})
	}
}
