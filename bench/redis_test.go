package bench

// drip's Redis store beside github.com/go-redis/redis_rate (GCRA through
// go-redis) and the Lua token bucket of seed 004 (called through
// go-redis), on one redis-server started for the run, in one run, so that
// the ratios in BENCHMARKS.md compare like with like:
//
//	cd bench && go test -run '^$' -bench 'Redis' -benchtime 200000x -count 5
//
// DRIP_BENCH_REDIS_URL names an existing server instead (its keys under
// "bench:" are overwritten). Every implementation holds the same limit, a
// million per second with a burst of a million, so that every decision is
// allowed and writes; callers pick keys uniformly among 100,000. Metrics:
// decisions/s, p50 and p99 latency (µs) of one decision as its caller sees
// it.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/testserver"
	"github.com/driplimit/drip/store/redisstore"
)

const redisRate = 1_000_000

// redisSeedLua is seed 004's script, verbatim.
const redisSeedLua = `
local rate     = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now      = tonumber(ARGV[3])
local cost     = tonumber(ARGV[4] or 1)

local data = redis.call("HMGET", KEYS[1], "tokens", "ts")
local tokens = tonumber(data[1]) or capacity
local ts     = tonumber(data[2]) or now

-- Lazy refill
local elapsed = (now - ts) / 1000
tokens = math.min(capacity, tokens + elapsed * rate)
ts = now

if tokens >= cost then
    tokens = tokens - cost
    redis.call("HMSET", KEYS[1], "tokens", tokens, "ts", ts)
    redis.call("PEXPIRE", KEYS[1], 60000)
    return {1, tokens, 0}     -- accept, tokens_remaining, retry_after_ms
else
    local retry_ms = math.ceil((cost - tokens) / rate * 1000)
    redis.call("HMSET", KEYS[1], "tokens", tokens, "ts", ts)
    redis.call("PEXPIRE", KEYS[1], 60000)
    return {0, tokens, retry_ms}
end
`

// redisDecider makes one decision for key.
type redisDecider func(ctx context.Context, key string) (bool, error)

type redisImpl struct {
	name string
	open func(b *testing.B, url string, callers int) redisDecider
}

var redisImpls = []redisImpl{
	{"redis_rate", redisRateImpl},
	{"seed-lua", redisSeedImpl},
	{"drip-unbatched", redisDripImpl(redisstore.WithoutBatching())},
	{"drip", redisDripImpl()}, // the default: batching, 64 x 2 workers
	{"drip-batch-4w", redisDripImpl(redisstore.WithBatching(64, 4))},
}

// redisGoClient is a go-redis client with a connection per caller, the
// pool size that serves go-redis best at this concurrency.
func redisGoClient(b *testing.B, url string, callers int) *goredis.Client {
	b.Helper()
	o, err := goredis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	o.PoolSize = callers
	c := goredis.NewClient(o)
	b.Cleanup(func() { c.Close() })
	return c
}

func redisRateImpl(b *testing.B, url string, callers int) redisDecider {
	l := redis_rate.NewLimiter(redisGoClient(b, url, callers))
	lim := redis_rate.Limit{Rate: redisRate, Burst: redisRate, Period: time.Second}
	return func(ctx context.Context, key string) (bool, error) {
		r, err := l.Allow(ctx, "bench:rr:"+key, lim)
		if err != nil {
			return false, err
		}
		return r.Allowed > 0, nil
	}
}

func redisSeedImpl(b *testing.B, url string, callers int) redisDecider {
	c := redisGoClient(b, url, callers)
	script := goredis.NewScript(redisSeedLua)
	rate := strconv.Itoa(redisRate)
	return func(ctx context.Context, key string) (bool, error) {
		now := strconv.FormatInt(time.Now().UnixMilli(), 10)
		v, err := script.Run(ctx, c, []string{"bench:seed:" + key}, rate, rate, now, "1").Int64Slice()
		if err != nil {
			return false, err
		}
		return v[0] == 1, nil
	}
}

func redisDripImpl(opts ...redisstore.Option) func(b *testing.B, url string, callers int) redisDecider {
	return func(b *testing.B, url string, callers int) redisDecider {
		s, err := redisstore.Open(url, append([]redisstore.Option{redisstore.WithPrefix("bench:drip:")}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		lim := drip.PerSecond(redisRate)
		return func(ctx context.Context, key string) (bool, error) {
			d, err := s.Apply(ctx, drip.OpTake, time.Time{}, drip.Request{Key: key, Limit: lim, Cost: 1})
			return d.Allowed, err
		}
	}
}

// redisURL starts the benchmark's server, stopped when the benchmark
// ends, or uses DRIP_BENCH_REDIS_URL.
func redisURL(b *testing.B) string {
	b.Helper()
	if u := os.Getenv("DRIP_BENCH_REDIS_URL"); u != "" {
		return u
	}
	if err := testserver.RedisMissing(); err != nil {
		b.Skipf("no Redis: %v", err)
	}
	srv, err := testserver.LaunchRedis(b.TempDir(), testserver.FreePort(b, 0))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Stop)
	return srv.URL()
}

func BenchmarkRedis(b *testing.B) {
	url := redisURL(b)
	for _, callers := range []int{64} {
		for _, impl := range redisImpls {
			b.Run(fmt.Sprintf("100k-keys/callers=%d/%s", callers, impl.name), func(b *testing.B) {
				decide := impl.open(b, url, callers)
				redisRun(b, callers, decide)
			})
		}
	}
}

// redisRun makes b.N decisions from callers goroutines and reports
// throughput and latency percentiles.
func redisRun(b *testing.B, callers int, decide redisDecider) {
	ctx := context.Background()
	var next atomic.Int64
	lat := make([][]time.Duration, callers)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	var denied atomic.Int64
	b.ResetTimer()
	start := time.Now()
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for next.Add(1) <= int64(b.N) {
				key := keys[rng.IntN(keyCount)]
				t := time.Now()
				ok, err := decide(ctx, key)
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				lat[w] = append(lat[w], time.Since(t))
				if !ok {
					denied.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	if n := denied.Load(); n > 0 {
		b.Fatalf("%d of %d decisions denied under a limit that always allows", n, b.N)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/el.Seconds(), "decisions/s")
	b.ReportMetric(redisPct(all, 0.5), "p50-µs")
	b.ReportMetric(redisPct(all, 0.99), "p99-µs")
}

func redisPct(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[int(q*float64(len(sorted)-1))]) / float64(time.Microsecond)
}
