package redisstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/redisstore"
)

// TestConcurrentMultiTakes: 64 callers at once, each multi-take all or
// nothing in one call (beside the batched single keys by default, without
// batching, and with scripts): a pair a+b and a pair a+c, where b and c run out and
// a never does, so a denied pair must leave a untouched. Exactly b's and
// c's bursts are granted, and a lost exactly what they were granted.
func TestConcurrentMultiTakes(t *testing.T) {
	url := testserver.SharedRedisURL(t)
	for name, opts := range map[string][]redisstore.Option{
		"batched":   nil,
		"unbatched": {redisstore.WithoutBatching()},
		"scripts":   {redisstore.WithScripts()},
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t, url, append(opts, redisstore.WithPrefix(randomTag()+":"))...)
			day := 24 * time.Hour
			wide := drip.Limit{Rate: 1, Period: day, Burst: 1000}
			narrow := drip.Limit{Rate: 1, Period: day, Burst: 100}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var ab, ac atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for w := range 64 {
				wg.Go(func() {
					for i := range 8 {
						other, n := "b", &ab
						if (w+i)%2 == 1 {
							other, n = "c", &ac
						}
						m, err := drip.Apply(ctx, s, bucket.Take, time.Time{},
							drip.Request{Key: "a", Limit: wide, Cost: 1}, drip.Request{Key: other, Limit: narrow, Cost: 1})
						if err != nil {
							errs <- err
							return
						}
						if m.Allowed {
							n.Add(1)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if ab.Load() != 100 || ac.Load() != 100 {
				t.Fatalf("granted a+b %d times and a+c %d times of 256 each, want each pair's burst of 100", ab.Load(), ac.Load())
			}
			m, err := drip.Apply(ctx, s, bucket.Peek, time.Time{}, drip.Request{Key: "a", Limit: wide, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			// A peek answers as a take of its cost would leave the bucket.
			if got := m.Decisions[0].Remaining; got != 799 {
				t.Fatalf("a peek of 1 on a leaves %d, want 1000 - 200 granted - 1 = 799 (a denied pair took from a)", got)
			}
		})
	}
}
