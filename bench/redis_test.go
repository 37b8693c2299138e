package bench

// drip's Redis store beside github.com/go-redis/redis_rate (GCRA through
// go-redis) and the textbook Lua token bucket with float state (called
// through go-redis), on one redis-server started for the run, in one run, so that
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
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/redisstore"
)

const redisRate = 1_000_000

// floatLua is the token bucket most Redis rate limiters start from: the
// state in a hash of floats (tokens, and the time in milliseconds), a lazy
// continuous refill, and a write on every call, allowed or not, with a
// minute's expiry. It answers {allowed, tokens, retry in ms}. Its float
// state drifts (the reason drip keeps fixed point); it is here as the cost
// of the simplest script.
const floatLua = `
local key = KEYS[1]
local per_sec, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local now_ms, cost = tonumber(ARGV[3]), tonumber(ARGV[4] or 1)

local state = redis.call("HMGET", key, "tokens", "ts")
local have = tonumber(state[1]) or burst
local since = tonumber(state[2]) or now_ms
have = math.min(burst, have + (now_ms - since) / 1000 * per_sec)

local allowed, wait_ms = 0, 0
if have >= cost then
    allowed, have = 1, have - cost
else
    wait_ms = math.ceil((cost - have) / per_sec * 1000)
end
redis.call("HMSET", key, "tokens", have, "ts", now_ms)
redis.call("PEXPIRE", key, 60000)
return {allowed, have, wait_ms}
`

type redisImpl struct {
	name string
	open func(b *testing.B, url string, callers int) decider
}

var redisImpls = []redisImpl{
	{"redis_rate", redisRateImpl},
	{"float-lua", redisFloatLuaImpl},
	{"drip-unbatched", redisDripImpl(redisstore.WithoutBatching())},
	{"drip", redisDripImpl()}, // the default: batching, 64 x 2 workers
	{"drip-batch-4w", redisDripImpl(redisstore.WithBatching(redisstore.Batching{InFlight: 4}))},
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

func redisRateImpl(b *testing.B, url string, callers int) decider {
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

func redisFloatLuaImpl(b *testing.B, url string, callers int) decider {
	c := redisGoClient(b, url, callers)
	script := goredis.NewScript(floatLua)
	rate := strconv.Itoa(redisRate)
	return func(ctx context.Context, key string) (bool, error) {
		now := strconv.FormatInt(time.Now().UnixMilli(), 10)
		v, err := script.Run(ctx, c, []string{"bench:float:" + key}, rate, rate, now, "1").Int64Slice()
		if err != nil {
			return false, err
		}
		return v[0] == 1, nil
	}
}

func redisDripImpl(opts ...redisstore.Option) func(b *testing.B, url string, callers int) decider {
	return func(b *testing.B, url string, callers int) decider {
		s, err := redisstore.Open(url, append([]redisstore.Option{redisstore.WithPrefix("bench:drip:")}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		lim := drip.PerSecond(redisRate)
		return func(ctx context.Context, key string) (bool, error) {
			m, err := drip.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: key, Limit: lim, Cost: 1})
			return m.Allowed, err
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
				redisClean(b, url)
				decide := impl.open(b, url, callers)
				cpu := redisCPU(b, url)
				redisRun(b, callers, decide)
				b.ReportMetric((redisCPU(b, url)-cpu)*1e6/float64(b.N), "server-cpu-µs")
			})
		}
	}
}

// redisClean deletes the keys of earlier runs (all under "bench:"), so
// that every implementation starts on a server that holds none: a server
// that holds the 100,000 keys of each implementation before it is slower
// for the later ones (measured: drip ran about 25% faster alone than
// fourth in line).
func redisClean(b *testing.B, url string) {
	b.Helper()
	c := redisGoClient(b, url, 1)
	ctx := context.Background()
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, "bench:*", 10000).Result()
		if err != nil {
			b.Fatal(err)
		}
		if len(keys) > 0 {
			if err := c.Unlink(ctx, keys...).Err(); err != nil {
				b.Fatal(err)
			}
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}

// redisCPU is the CPU time the server has used (INFO cpu: used_cpu_user
// + used_cpu_sys), in seconds: per decision, it shows what each
// implementation costs the one thread that serves all callers.
func redisCPU(b *testing.B, url string) float64 {
	b.Helper()
	info, err := redisGoClient(b, url, 1).Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu: %q: %v", line, err)
			}
			sum += x
		}
	}
	return sum
}

// redisRun makes b.N decisions from callers goroutines and reports
// throughput, latency percentiles and the client's CPU per decision.
func redisRun(b *testing.B, callers int, decide decider) {
	r := closedLoop(b, callers, false, 11, decide)
	if r.denied > 0 {
		b.Fatalf("%d of %d decisions denied under a limit that always allows", r.denied, b.N)
	}
	b.ReportMetric(float64(b.N)/r.elapsed.Seconds(), "decisions/s")
	b.ReportMetric(pct(r.lat, 0.5), "p50-µs")
	b.ReportMetric(pct(r.lat, 0.99), "p99-µs")
	b.ReportMetric(r.cpu.Seconds()*1e6/float64(b.N), "client-cpu-µs")
}

// BenchmarkRedisBatchTuning measures batching's knobs at 64 callers: calls
// in flight (workers) and the most requests per call.
//
//	cd bench && go test -run '^$' -bench 'RedisBatchTuning' -benchtime 200000x
func BenchmarkRedisBatchTuning(b *testing.B) {
	url := redisURL(b)
	for _, max := range []int{16, 64} {
		for _, conns := range []int{1, 2, 4, 8} {
			b.Run(fmt.Sprintf("max=%d/conns=%d", max, conns), func(b *testing.B) {
				redisClean(b, url)
				redisRun(b, 64, redisDripImpl(redisstore.WithBatching(redisstore.Batching{MaxBatch: max, InFlight: conns}))(b, url, 64))
			})
		}
	}
}

// BenchmarkRedisVsRate holds redisstore (batching on, as it comes) against
// redis_rate in alternating rounds on one server: each round runs both,
// the first of the last round going second, redisVsRateN decisions each,
// 64 callers, 100,000 keys. The throughput of a phase moves with the
// machine's other work (1.3x to 14x between runs on a shared machine);
// the CPU each decision costs (this process's, callers and client
// library, plus redis-server's) and the median latency a caller sees move
// much less, and the ratios are taken round by round, then their median.
//
//	cd bench && go test -run '^$' -bench 'RedisVsRate' -benchtime 1x -v
func BenchmarkRedisVsRate(b *testing.B) {
	const callers, rounds, redisVsRateN = 64, 6, 100_000
	url := redisURL(b)
	redisClean(b, url)
	impls := []struct {
		name   string
		decide decider
	}{
		{"drip", redisDripImpl()(b, url, callers)},
		{"redis_rate", redisRateImpl(b, url, callers)},
	}
	type phase struct{ perSec, p50, cpu float64 }
	run := func(d decider, seed uint64) phase {
		srv := redisCPU(b, url)
		r := closedLoopN(b, redisVsRateN, callers, false, seed, d)
		if r.denied > 0 {
			b.Fatalf("%d of %d decisions denied under a limit that always allows", r.denied, redisVsRateN)
		}
		cpu := r.cpu.Seconds() + redisCPU(b, url) - srv
		return phase{redisVsRateN / r.elapsed.Seconds(), pct(r.lat, 0.5), cpu * 1e6 / redisVsRateN}
	}
	for _, im := range impls { // warm: connections made, every key held
		run(im.decide, 1)
	}
	med := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
	for range b.N {
		res := make([][]phase, len(impls))
		for r := range rounds {
			for k := range impls {
				i := k
				if r%2 == 1 {
					i = len(impls) - 1 - k
				}
				p := run(impls[i].decide, uint64(r+2))
				res[i] = append(res[i], p)
				b.Logf("round %d %s: %.0f decisions/s, p50 %.0f µs, cpu %.1f µs/decision", r, impls[i].name, p.perSec, p.p50, p.cpu)
			}
		}
		for i, im := range impls {
			var ps, p50, cpu []float64
			for _, p := range res[i] {
				ps, p50, cpu = append(ps, p.perSec), append(p50, p.p50), append(cpu, p.cpu)
			}
			b.ReportMetric(med(ps), im.name+"-decisions/s")
			b.ReportMetric(med(p50), im.name+"-p50-µs")
			b.ReportMetric(med(cpu), im.name+"-cpu-µs")
		}
		var ps, p50, cpu []float64
		for r := range rounds {
			d, rr := res[0][r], res[1][r]
			ps, p50, cpu = append(ps, d.perSec/rr.perSec), append(p50, rr.p50/d.p50), append(cpu, rr.cpu/d.cpu)
		}
		b.ReportMetric(med(ps), "drip/redis_rate-decisions/s")
		b.ReportMetric(med(p50), "redis_rate/drip-p50")
		b.ReportMetric(med(cpu), "redis_rate/drip-cpu")
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkRedisLibrary calls each library as its users do, with its
// defaults: drip.New on redisstore.Open(url) and Limiter.Take; redis_rate
// on a go-redis client of redis.ParseURL(url) (its default pool) and
// Allow. 64 goroutines (b.RunParallel), keys "user:N" made per call,
// uniformly among 100,000, a limit that allows every call. cpu-µs/op is
// this process's CPU plus redis-server's, per decision.
//
//	cd bench && go test -run '^$' -bench 'RedisLibrary' -benchtime 200000x -count 6
func BenchmarkRedisLibrary(b *testing.B) {
	url := redisURL(b)
	libs := []struct {
		name string
		open func(b *testing.B) decider
	}{
		{"drip", func(b *testing.B) decider {
			s, err := redisstore.Open(url)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			l := drip.New(s, drip.PerSecond(redisRate))
			return func(ctx context.Context, key string) (bool, error) {
				d, err := l.Take(ctx, key)
				return d.Allowed, err
			}
		}},
		{"redis_rate", func(b *testing.B) decider {
			o, err := goredis.ParseURL(url)
			if err != nil {
				b.Fatal(err)
			}
			c := goredis.NewClient(o)
			b.Cleanup(func() { c.Close() })
			l := redis_rate.NewLimiter(c)
			lim := redis_rate.Limit{Rate: redisRate, Burst: redisRate, Period: time.Second}
			return func(ctx context.Context, key string) (bool, error) {
				r, err := l.Allow(ctx, key, lim)
				if err != nil {
					return false, err
				}
				return r.Allowed > 0, nil
			}
		}},
	}
	for _, lib := range libs {
		b.Run(lib.name, func(b *testing.B) {
			redisDel(b, url, "drip:user:")
			redisDel(b, url, "rate:user:")
			decide := lib.open(b)
			ctx := context.Background()
			var denied, failed atomic.Int64
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			srv := redisCPU(b, url)
			cpu := processCPU()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
				for pb.Next() {
					ok, err := decide(ctx, "user:"+strconv.Itoa(rng.IntN(keyCount)))
					if err != nil {
						failed.Add(1)
					} else if !ok {
						denied.Add(1)
					}
				}
			})
			b.StopTimer()
			client := (processCPU() - cpu).Seconds()
			server := redisCPU(b, url) - srv
			if failed.Load()+denied.Load() > 0 {
				b.Fatalf("%d failed, %d denied of %d", failed.Load(), denied.Load(), b.N)
			}
			b.ReportMetric((client+server)*1e6/float64(b.N), "cpu-µs/op")
			b.ReportMetric(server*1e6/float64(b.N), "server-cpu-µs/op")
		})
	}
}
