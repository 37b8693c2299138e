package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

// TestTTL checks that a written bucket's key lives at least a minute past
// the moment the bucket is full again, and not wildly longer, also when a
// later write keeps the TTL it found.
func TestTTL(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t))
	for _, lim := range []drip.Limit{
		{Rate: 10, Period: 24 * time.Hour, Burst: 10}, // a token every 2.4 h: each take needs a longer TTL
		drip.PerSecond(1000),                          // full again at once: later takes keep the TTL
	} {
		ttlCheck(t, s, lim)
	}
}

func ttlCheck(t *testing.T, s *redisstore.Store, lim drip.Limit) {
	c := s.Client()
	ctx := context.Background()
	key := "ttl:" + randomTag()
	for i := range 5 {
		// The TTL counts down from the decision on: PTTL, read later,
		// shows it less the time since, which is at most el (plus the
		// millisecond PTTL rounds to).
		start := time.Now()
		d, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: key, Limit: lim, Cost: 1})
		if err != nil || !d.Allowed {
			t.Fatalf("take %d: %+v, %v", i, d, err)
		}
		pttl, err := c.Do(ctx, c.B().Pttl().Key("drip:"+key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		el := time.Since(start)
		need := d.ResetAfter + time.Minute
		if got := time.Duration(pttl) * time.Millisecond; got < need-el-time.Millisecond || got > need+3*time.Minute {
			t.Fatalf("take %d: TTL %v %v after the decision, want at least %v (reset after %v + a minute) and not much more", i, got, el, need, d.ResetAfter)
		}
	}
}

// TestLeaseTTL: a concurrency key lives a minute past its latest lease,
// and an empty one (every lease released) is no key at all.
func TestLeaseTTL(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t))
	c := s.Client()
	ctx := context.Background()
	key := "lease-ttl:" + randomTag()
	lim := drip.InFlight(2, 10*time.Minute)
	start := time.Now()
	if _, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: key, Limit: lim, Lease: "a"}); err != nil {
		t.Fatal(err)
	}
	pttl, err := c.Do(ctx, c.B().Pttl().Key("drip:"+key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	need := 10*time.Minute + time.Minute
	if got := time.Duration(pttl) * time.Millisecond; got < need-el-time.Millisecond || got > need+time.Second {
		t.Fatalf("TTL %v %v after the acquire, want a minute past the lease's 10m", got, el)
	}
	if _, err := storetest.Apply(ctx, s, bucket.Refund, time.Time{}, drip.Request{Key: key, Limit: lim, Lease: "a"}); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Do(ctx, c.B().Exists().Key("drip:"+key).Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("after the last release: exists %d, %v; want no key", n, err)
	}
}
