package redisstore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

// TestWrongType: a key that holds another Redis type (something else wrote
// under drip's prefix) fails its own requests with ErrWrongType and
// nothing else: concurrent calls batched with it are decided and counted
// exactly, and a multi-take including it writes nothing.
func TestWrongType(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t), redisstore.WithPrefix("wt"+randomTag()+":"))
	ctx := context.Background()
	bad := "bad"
	if err := s.Client().Do(ctx, s.Client().B().Hset().Key(s.Prefix()+bad).FieldValue().FieldValue("f", "v").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	lim := drip.PerHour(1).WithBurst(100)
	var granted, badErrs atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "good"
			if i%50 == 0 {
				key = bad
			}
			d, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: key, Limit: lim, Cost: 1})
			switch {
			case key == bad && errors.Is(err, redisstore.ErrWrongType):
				badErrs.Add(1)
			case err != nil:
				errs <- err
			case d.Allowed:
				granted.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a good key's call failed: %v", err)
	}
	d, err := storetest.Apply(ctx, s, bucket.Peek, time.Time{}, drip.Request{Key: "good", Limit: lim, Cost: 0})
	// 196 calls on the good key: exactly its burst of 100 granted, and
	// the bucket is empty (but for a few microseconds of refill).
	if err != nil || badErrs.Load() != 4 || granted.Load() != 100 || d.Tokens >= 0.01 {
		t.Fatalf("bad-key errors %d (want 4), granted %d (want 100), good bucket holds %v (err %v)", badErrs.Load(), granted.Load(), d.Tokens, err)
	}
	m, err := drip.Apply(ctx, s, bucket.Take, time.Time{}, []drip.Request{{Key: "fresh", Limit: lim, Cost: 1}, {Key: bad, Limit: lim, Cost: 1}}...)
	if !errors.Is(err, redisstore.ErrWrongType) {
		t.Fatalf("multi-take with a bad key: %+v %v", m, err)
	}
	if d, _ := storetest.Apply(ctx, s, bucket.Peek, time.Time{}, drip.Request{Key: "fresh", Limit: lim, Cost: 0}); d.Tokens != 100 {
		t.Fatalf("the multi-take with a bad key took from the good one: %+v", d)
	}
}
