package grpclimit_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/grpclimit"
	"github.com/driplimit/drip/store/memstore"
)

// TestQueueRate: behind a rate rule of 10 a second, a bucket of 1 and
// max_wait 300 ms, of 6 calls at once the one the bucket holds and the 3
// it refills within 300 ms run (at 0, 100, 200 and 300 ms), and 2 are
// refused with ResourceExhausted at once.
func TestQueueRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		lim := grpclimit.New(ms, parse(t, `{"rules": [{"name": "q", "limit_keys": ["global"], "max_wait": "300ms",
		  "algorithm_config": {"rps": 10, "burst": 1}}]}`), engine.WithLogger(slog.New(slog.DiscardHandler)))
		defer lim.Close()
		in := lim.UnaryInterceptor()
		info := &grpc.UnaryServerInfo{FullMethod: "/svc/M"}
		start := time.Now()
		var mu sync.Mutex
		ran := map[time.Duration]int{}
		refused := 0
		var wg sync.WaitGroup
		for range 6 {
			wg.Go(func() {
				_, err := in(context.Background(), nil, info, func(context.Context, any) (any, error) {
					mu.Lock()
					ran[time.Since(start)]++
					mu.Unlock()
					return nil, nil
				})
				if err != nil {
					if status.Code(err) != codes.ResourceExhausted || time.Since(start) != 0 {
						t.Errorf("a refused call: %v after %v, want ResourceExhausted at once", err, time.Since(start))
					}
					mu.Lock()
					refused++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		ms100 := 100 * time.Millisecond
		want := map[time.Duration]int{0: 1, ms100: 1, 2 * ms100: 1, 3 * ms100: 1}
		if len(ran) != len(want) || refused != 2 {
			t.Errorf("calls ran at %v and %d were refused, want %v and 2", ran, refused, want)
		}
		for at, n := range want {
			if ran[at] != n {
				t.Errorf("calls ran at %v and %d were refused, want %v and 2", ran, refused, want)
				break
			}
		}
	})
}
