package redisstore_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

// TestExtremeAgainstMemstore drives the script where doubles cannot go:
// bursts of 1e12 tokens, rates of a millionth of a token, periods of
// centuries, times near the ends of int64 nanoseconds and before 1970,
// clocks stepping back, and huge reservations. Every decision must equal
// the memory store's (bucket.Eval), field for field.
func TestExtremeAgainstMemstore(t *testing.T) {
	t.Run("batching", func(t *testing.T) { extremeAgainstMemstore(t, open(t, testserver.SharedRedisURL(t))) })
	t.Run("without-batching", func(t *testing.T) {
		extremeAgainstMemstore(t, open(t, testserver.SharedRedisURL(t), redisstore.WithoutBatching()))
	})
}

// extremeLimits are limits where doubles cannot go.
var extremeLimits = []drip.Limit{
	{Rate: 1e12, Period: 1, Burst: 1e12},
	{Rate: 1e-6, Period: 290 * 365 * 24 * time.Hour, Burst: 1e12},
	{Rate: 999999.999999, Period: 3 * time.Nanosecond, Burst: 7.5},
	{Rate: 3, Period: 700 * time.Millisecond, Burst: 1e12, Refill: drip.Interval},
	{Rate: 1e12, Period: 100 * 365 * 24 * time.Hour, Burst: 1, Refill: drip.Interval},
	{Algorithm: drip.FixedWindow, Rate: 123456.789, Period: 97 * 365 * 24 * time.Hour, Start: 5},
	{Algorithm: drip.FixedWindow, Rate: 1e-6, Period: 7 * time.Second, Burst: 1e12},
	{Rate: 7, Period: 3 * time.Second, Burst: 5, MaxReserved: 1e12},
}

// extremeStarts are the times the extreme runs start at: now, near the
// end of int64 nanoseconds, before 1970, 0 and 2^53.
func extremeStarts() []int64 {
	return []int64{time.Now().UnixNano(), 9_000_000_000_000_000_000, -2_000_000_000_000_000_000, 0, 1 << 53}
}

func extremeAgainstMemstore(t *testing.T, rs *redisstore.Store) {
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	limits, starts := extremeLimits, extremeStarts()
	var errs, allowed, denied int
	for round, start := range starts {
		now := start
		prefix := "extreme:" + randomTag() + ":"
		for step := range 300 {
			switch rng.IntN(6) {
			case 0:
				now -= rng.Int64N(int64(time.Hour)) // the clock steps back
			case 1:
				now += rng.Int64N(int64(100 * 365 * 24 * time.Hour))
			default:
				now += rng.Int64N(int64(10 * time.Second))
			}
			if now > 9_200_000_000_000_000_000 {
				now = 9_200_000_000_000_000_000
			}
			at := time.Unix(0, now)
			li := rng.IntN(len(limits))
			r := drip.Request{Key: prefix + string(rune('a'+li)), Limit: limits[li]}
			burst := r.Limit.Burst
			if burst == 0 {
				burst = r.Limit.Rate
			}
			switch rng.IntN(4) {
			case 0:
				r.Cost = burst
			case 1:
				r.Cost = float64(rng.IntN(3))
			case 2:
				r.Cost = burst * rng.Float64()
			default:
				r.Cost, r.Reserve = burst*3*rng.Float64(), true
			}
			op := []bucket.Op{bucket.Take, bucket.Take, bucket.Peek, bucket.Refund}[rng.IntN(4)]
			want, werr := storetest.Apply(ctx, ms, op, at, r)
			got, gerr := storetest.Apply(ctx, rs, op, at, r)
			if (werr == nil) != (gerr == nil) || got != want {
				t.Fatalf("round %d step %d: %s %+v at %d:\n got  %+v (%v)\n want %+v (%v)", round, step, op, r, now, got, gerr, want, werr)
			}
			switch {
			case werr != nil:
				errs++
			case want.Allowed:
				allowed++
			default:
				denied++
			}
		}
	}
	t.Logf("%d allowed, %d denied, %d errors", allowed, denied, errs)
	if denied < 100 || allowed < 100 {
		t.Errorf("the run should both allow and deny often")
	}
}

// TestExtremeBlocksAgainstMemstore does the same with blocks of leased
// tokens among the requests (bucket.EvalBlocks in the script's big
// integers): block takes of any size up to the burst, returns, and plain
// requests under the blocks' cap, on the extreme limits and times above.
// Every result must equal the memory store's, field for field.
func TestExtremeBlocksAgainstMemstore(t *testing.T) {
	rs := open(t, testserver.SharedRedisURL(t))
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(27, 13))
	limits, starts := extremeLimits, extremeStarts()
	var blocks, allowed, denied int
	res := make([]bucket.Result, 2)
	for round, start := range starts {
		now := start
		prefix := "extreme-blocks:" + randomTag() + ":"
		for step := range 300 {
			switch rng.IntN(8) {
			case 0:
				now -= rng.Int64N(int64(time.Second)) // the clock steps back
			case 1:
				now += rng.Int64N(int64(time.Minute)) // past some blocks' expiry
			default:
				now += rng.Int64N(int64(500 * time.Millisecond))
			}
			now = min(now, 9_200_000_000_000_000_000)
			at := time.Unix(0, now)
			li := rng.IntN(len(limits))
			key := prefix + string(rune('a'+li))
			p, err := limits[li].Params(key)
			if err != nil {
				t.Fatal(err)
			}
			var it bucket.Prepared
			op := bucket.Take
			switch x := rng.IntN(10); {
			case x < 4:
				// A block take, of up to the burst, for up to a minute.
				size := rng.Int64N(p.Burst + 1)
				if rng.IntN(3) == 0 {
					size = p.Burst / int64(1+rng.IntN(8))
				}
				it, err = store.PrepareBlock(op, key, p, size, "b"+strconv.Itoa(rng.IntN(6)), time.Duration(1+rng.Int64N(bucket.MaxBlockTTL/int64(time.Millisecond)))*time.Millisecond)
				blocks++
			case x < 6:
				op = bucket.Refund
				it, err = store.PrepareBlock(op, key, p, rng.Int64N(p.Burst+1), "b"+strconv.Itoa(rng.IntN(6)), 0)
			default:
				op = []bucket.Op{bucket.Take, bucket.Take, bucket.Peek, bucket.Refund}[rng.IntN(4)]
				cost := min(int64(rng.IntN(3)), p.Burst/bucket.Micro)
				err = store.Prepare(&it, op, key, &p, float64(cost), rng.IntN(4) == 0, "")
			}
			if err != nil {
				t.Fatal(err)
			}
			werr := ms.Apply(ctx, op, at, []bucket.Prepared{it}, res[:1])
			gerr := rs.Apply(ctx, op, at, []bucket.Prepared{it}, res[1:])
			if werr != nil || gerr != nil || res[0] != res[1] {
				t.Fatalf("round %d step %d: %s %+v at %d:\n got  %+v (%v)\n want %+v (%v)", round, step, op, it, now, res[1], gerr, res[0], werr)
			}
			if res[0].Allowed {
				allowed++
			} else {
				denied++
			}
		}
	}
	t.Logf("%d allowed, %d denied, %d block takes", allowed, denied, blocks)
	if denied < 100 || allowed < 100 {
		t.Errorf("the run should both allow and deny often")
	}
}
