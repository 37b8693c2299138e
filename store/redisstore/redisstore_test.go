package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// open returns a store on url, closed when the test ends.
func open(t testing.TB, url string, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	s, err := redisstore.Open(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// randomTag is a fresh key prefix, so tests sharing a server keep apart.
func randomTag() string { return testserver.Prefix() }

// The conformance suites (these, TestBlocksCluster and
// TestScriptsWithoutFunctions) run in parallel with each other: each keeps
// its keys under a prefix of its own, or has a server of its own, and
// spends most of its time waiting for round trips, which overlap.
func TestConformance(t *testing.T) {
	t.Parallel()
	url := testserver.SharedRedisURL(t)
	// A prefix of its own: the overrides live under the store's prefix,
	// and TestConformanceWithoutBatching runs beside it on this server
	// (sharing one, each saw the other's versions and bound).
	s := open(t, url, redisstore.WithPrefix("drip:"+randomTag()+":"))
	storetest.Run(t, func(t *testing.T) store.Store { return s })
}

// TestConformanceWithoutBatching runs the suite with every decision its
// own script call (the default coalesces concurrent ones, and so does
// TestConformance).
func TestConformanceWithoutBatching(t *testing.T) {
	t.Parallel()
	url := testserver.SharedRedisURL(t)
	s := open(t, url, redisstore.WithoutBatching(), redisstore.WithPrefix("drip:"+randomTag()+":"))
	storetest.Run(t, func(t *testing.T) store.Store { return s })
}

// TestConformanceCluster runs the suite's calls (storetest.RunTransport)
// and the extremes on Redis Cluster. Each test gets a prefix with its own
// hash tag, so that its multi-takes can span its keys while the tests
// spread over the cluster's masters. The long model comparisons are left
// out (see runTransport).
func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	url := testserver.SharedRedisClusterURL(t)
	c := open(t, url).Client()
	runTransport(t, func(t *testing.T) store.Store {
		return redisstore.New(c, redisstore.WithPrefix("drip:{"+randomTag()+"}:"))
	})
}

// runTransport runs storetest.RunTransport and the extremes
// (storetest.RunExtremes) on a store that TestConformance and
// TestConformanceWithoutBatching hold to the whole suite on a standalone
// server: on Redis Cluster, whose client sends each call to its key's
// master but the same script the same arguments (without batching, as
// TestConformanceWithoutBatching), and through scripts instead of
// functions, which wrap the same decision code (decide.lua). The long
// model comparisons (Traces, Random, Windows, Calendar, their replays)
// would send the same calls to the same code again: on Cluster and
// through scripts they took 18 s of the package's 98 (load average 5 to
// 8).
func runTransport(t *testing.T, ns storetest.NewStore) {
	storetest.RunTransport(t, ns)
	t.Run("Extremes", func(t *testing.T) { storetest.RunExtremes(t, ns) })
}

// TestExtremesPast holds Redis and Redis Cluster to the exact model from
// before 1970 (storetest.RunExtremesPast): every key lives at least a
// minute past its expiry, longer than the test.
func TestExtremesPast(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		s := open(t, testserver.SharedRedisURL(t))
		storetest.RunExtremesPast(t, func(t *testing.T) store.Store { return s })
	})
	t.Run("cluster", func(t *testing.T) {
		c := open(t, testserver.SharedRedisClusterURL(t)).Client()
		storetest.RunExtremesPast(t, func(t *testing.T) store.Store {
			return redisstore.New(c, redisstore.WithPrefix("drip:{"+randomTag()+"}:"))
		})
	})
}

func TestClusterCrossSlot(t *testing.T) {
	url := testserver.SharedRedisClusterURL(t)
	s := open(t, url)
	ctx := context.Background()
	tag := randomTag()
	l := drip.PerSecond(10)
	// Keys under one hash tag: one slot, one call, all-or-nothing.
	rs := []drip.Request{
		{Key: redisstore.Tag(tag, "user:1"), Limit: l, Cost: 1},
		{Key: redisstore.Tag(tag, ""), Limit: drip.PerSecond(100), Cost: 1},
	}
	m, err := drip.Apply(ctx, s, bucket.Take, time.Time{}, rs...)
	if err != nil || !m.Allowed {
		t.Fatalf("tagged multi-take: %+v, %v", m, err)
	}
	// Keys without a shared tag: a clear error, and nothing taken.
	a, b := "user:"+tag+":a", "user:"+tag+":b"
	for i := 0; redisstore.Slot(redisstore.DefaultPrefix+a) == redisstore.Slot(redisstore.DefaultPrefix+b); i++ {
		b += "x"
	}
	_, err = drip.Apply(ctx, s, bucket.Take, time.Time{}, []drip.Request{
		{Key: a, Limit: l, Cost: 5}, {Key: b, Limit: l, Cost: 5},
	}...)
	if !errors.Is(err, redisstore.ErrCrossSlot) {
		t.Fatalf("cross-slot multi-take: err %v, want ErrCrossSlot", err)
	}
	d, err := storetest.Apply(ctx, s, bucket.Peek, time.Time{}, drip.Request{Key: a, Limit: l, Cost: 0})
	if err != nil || d.Tokens != 10 {
		t.Fatalf("after a refused multi-take %q holds %v tokens (%v), want 10", a, d.Tokens, err)
	}
}

// TestClusterSeparately: a multi-take across hash slots through
// store.Separately (the engine's store) is taken one key at a time, and a
// denied one leaves no slot and no token taken.
func TestClusterSeparately(t *testing.T) {
	s := open(t, testserver.SharedRedisClusterURL(t))
	sep := store.Separately{Store: s}
	ctx := context.Background()
	tag := randomTag()
	c, r := "c:"+tag, "r:"+tag
	for redisstore.Slot(redisstore.DefaultPrefix+c) == redisstore.Slot(redisstore.DefaultPrefix+r) {
		r += "x"
	}
	one, rate := drip.InFlight(1, time.Minute), drip.PerMinute(1)
	if d, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: r, Limit: rate, Cost: 1}); err != nil || !d.Allowed {
		t.Fatalf("emptying the bucket: %+v %v", d, err)
	}
	m, err := drip.Apply(ctx, sep, bucket.Take, time.Time{}, []drip.Request{
		{Key: c, Limit: one, Lease: "L1"}, {Key: r, Limit: rate, Cost: 1}}...)
	if err != nil || m.Allowed || !m.Decisions[0].Allowed || m.Decisions[1].Allowed {
		t.Fatalf("a lease beside an empty bucket: %+v %v, want denied by the bucket", m, err)
	}
	if d, err := storetest.Apply(ctx, s, bucket.Peek, time.Time{}, drip.Request{Key: c, Limit: one}); err != nil || d.Remaining != 1 {
		t.Errorf("after the denied multi-take: %+v %v, want the slot free", d, err)
	}
	if d, err := storetest.Apply(ctx, s, bucket.Peek, time.Time{}, drip.Request{Key: r, Limit: rate}); err != nil || d.Tokens >= 1 {
		t.Errorf("after the denied multi-take the bucket holds %v (%v), want less than a token", d.Tokens, err)
	}
}

// TestSlot holds Slot to the server's CLUSTER KEYSLOT.
func TestSlot(t *testing.T) {
	c := open(t, testserver.SharedRedisClusterURL(t)).Client()
	keys := []string{"123456789", "foo", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{", "}{a}", "", "drip:{t}:x", "\xff\x00"}
	for i := range 50 {
		keys = append(keys, randomTag()+strconv.Itoa(i))
	}
	for _, key := range keys {
		want, err := c.Do(context.Background(), c.B().ClusterKeyslot().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if got := redisstore.Slot(key); int64(got) != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}
