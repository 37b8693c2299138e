package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/redisstore"
)

// Stall test settings: the store deadline, the margin a loaded machine
// may add to an answer, and the steady load.
const (
	stallTimeout = 500 * time.Millisecond
	stallMargin  = 2 * time.Second
	stallRate    = 200 // requests a second
)

// TestStalledStore runs the gateway under a steady load of stallRate
// requests a second while its store stalls: Redis paused (CLIENT PAUSE
// 5000 ALL), and PostgreSQL with the bucket table locked. The lock is held
// for 3 s rather than 10: six store deadlines, so that statements stay
// blocked far past their callers' deadlines and new requests keep
// arriving behind them, which is the property under test; a longer lock
// adds only CI time. Every request must be answered within the store
// deadline plus a margin, by the store or by on_error (deny: 503);
// goroutines and heap stay bounded (peaks logged); after the stall a fresh
// key with burst 10 grants exactly 10; and (ErroredTookNothing) every load
// key has granted exactly its burst to the requests that got a decision:
// a request answered by on_error took nothing from the store, even the
// ones the store ran after their deadline (Redis runs the commands it
// queued during a pause; PostgreSQL the statements that waited on the
// lock).
func TestStalledStore(t *testing.T) {
	for _, kind := range []string{"redis", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			var store store.Store
			var stall func()
			switch kind {
			case "redis":
				r := testserver.StartRedis(t)
				s, err := redisstore.Open(r.URL())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				store = s
				stall = func() {
					if out, err := r.Cli("CLIENT", "PAUSE", "5000", "ALL"); err != nil {
						t.Fatalf("CLIENT PAUSE: %v %s", err, out)
					}
					time.Sleep(5 * time.Second)
				}
			case "postgres":
				pg := testserver.StartPostgres(t)
				store = openPostgres(t, pg.URL())
				stall = func() {
					ctx := context.Background()
					conn, err := pgx.Connect(ctx, pg.URL())
					if err != nil {
						t.Fatal(err)
					}
					defer conn.Close(ctx)
					tx, err := conn.Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := tx.Exec(ctx, "LOCK TABLE drip.buckets IN ACCESS EXCLUSIVE MODE"); err != nil {
						t.Fatal(err)
					}
					time.Sleep(3 * time.Second)
					if err := tx.Rollback(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			testStall(t, store, stall)
		})
	}
}

type stallResult struct {
	key     int
	code    int
	took    time.Duration
	stalled bool // sent while the store stalled
}

func testStall(t *testing.T, store store.Store, stall func()) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"on_error": "deny", "circuit_breaker": {"failures": 1000000, "cooldown": "100ms"},
	  "rules": [{"name": "api", "limit_keys": ["header:x-api-key"],
	    "algorithm_config": {"rate": 1, "period": "1h", "burst": 10}}]}`)
	up := newUpstream(t)
	srv := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1, StoreTimeout: stallTimeout}, store)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * stallRate}}
	t.Cleanup(client.CloseIdleConnections)
	get := func(key string) (int, error) {
		req, _ := http.NewRequest("GET", srv.base+"/", nil)
		req.Header.Set("X-Api-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}

	// Peaks, sampled every 20 ms.
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseG, baseHeap := runtime.NumGoroutine(), ms.HeapInuse
	peakG, peakHeap := baseG, ms.HeapInuse
	var mu sync.Mutex
	var results []stallResult
	var stalled, done bool
	var wg sync.WaitGroup
	sampler := time.NewTicker(20 * time.Millisecond)
	load := time.NewTicker(time.Second / stallRate)
	stallDone := make(chan struct{})
	go func() {
		time.Sleep(time.Second)
		mu.Lock()
		stalled = true
		mu.Unlock()
		stall()
		mu.Lock()
		stalled = false
		mu.Unlock()
		time.Sleep(time.Second)
		close(stallDone)
	}()
	for i := 0; !done; i++ {
		select {
		case <-sampler.C:
			runtime.ReadMemStats(&ms)
			peakG, peakHeap = max(peakG, runtime.NumGoroutine()), max(peakHeap, ms.HeapInuse)
		case <-load.C:
			mu.Lock()
			during := stalled
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				begin := time.Now()
				code, err := get(fmt.Sprintf("load-%d", i%50))
				if err != nil {
					t.Errorf("request: %v", err)
				}
				mu.Lock()
				results = append(results, stallResult{i % 50, code, time.Since(begin), during})
				mu.Unlock()
			}()
		case <-stallDone:
			done = true
		}
	}
	sampler.Stop()
	load.Stop()
	wg.Wait()

	var worst time.Duration
	var denied, late int
	codes := map[int]int{}
	for _, r := range results {
		worst = max(worst, r.took)
		codes[r.code]++
		if r.took > stallTimeout+stallMargin {
			late++
		}
		if r.stalled && r.code == 503 {
			denied++
		}
		if r.code != 200 && r.code != 429 && r.code != 503 {
			t.Errorf("status %d: want a decision (200, 429) or on_error deny (503)", r.code)
		}
	}
	t.Logf("%d requests (%v by status), slowest %v; peaks: %d goroutines (%d before), heap in use %.1f MiB (%.1f before)",
		len(results), codes, worst.Round(time.Millisecond), peakG, baseG, float64(peakHeap)/(1<<20), float64(baseHeap)/(1<<20))
	if late > 0 {
		t.Errorf("%d requests took longer than the store deadline (%v) plus %v; slowest %v", late, stallTimeout, stallMargin, worst)
	}
	if denied == 0 {
		t.Errorf("no request was denied by on_error during the stall: did the store stall?")
	}
	// In flight at once: at most stallRate*(deadline+margin) requests, a
	// few goroutines each (client, server connection, transport).
	if bound := baseG + 4*stallRate*int((stallTimeout+stallMargin)/time.Millisecond)/1000; peakG > bound {
		t.Errorf("goroutines peaked at %d, bound %d", peakG, bound)
	}
	if peakHeap > baseHeap+64<<20 {
		t.Errorf("heap in use peaked at %.1f MiB, %.1f MiB before", float64(peakHeap)/(1<<20), float64(baseHeap)/(1<<20))
	}

	// After the stall: the store decides again, and a fresh key grants
	// exactly its burst.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if code, _ := call(t, "GET", srv.admin+"/readyz", ""); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/readyz not 200 within 15 s after the stall")
		}
	}
	granted := 0
	for range 15 {
		code, err := get("fresh-after-stall")
		if err != nil {
			t.Fatal(err)
		}
		if code == 200 {
			granted++
		} else if code != 429 {
			t.Fatalf("after the stall: status %d", code)
		}
	}
	if granted != 10 {
		t.Errorf("a fresh key with burst 10 granted %d after the stall", granted)
	}

	// A request answered with an error took nothing: each load key,
	// asked until it denies, has granted exactly its burst to the
	// requests that got a decision.
	t.Run("ErroredTookNothing", func(t *testing.T) { stallGrants(t, results, get) })
}

func stallGrants(t *testing.T, results []stallResult, get func(string) (int, error)) {
	var grants [50]int
	for _, r := range results {
		if r.code == 200 {
			grants[r.key]++
		}
	}
	short := 0
	for k := range grants {
		for range 11 - grants[k] {
			code, err := get(fmt.Sprintf("load-%d", k))
			if err != nil {
				t.Fatal(err)
			}
			if code == 200 {
				grants[k]++
			}
		}
		if grants[k] != 10 {
			short++
			t.Logf("load-%d granted %d to answered requests, want 10", k, grants[k])
		}
	}
	if short > 0 {
		t.Errorf("%d of 50 keys granted less than their burst to answered requests: requests answered with an error took tokens", short)
	}
}
