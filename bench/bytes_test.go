package bench

// What a store holds per key, on Redis and PostgreSQL, beside peers fed the
// same keys:
//
//	cd bench && go test -run '^$' -bench 'Bytes' -benchtime 1x -v
//
// Redis: the growth of INFO memory's used_memory over keyBytesN keys,
// per key, and MEMORY USAGE of sampled keys (the key's own allocations,
// without the keyspace's hash tables). Envoy: drip serve's gRPC listener
// on redisstore as it comes, and envoyproxy/ratelimit at its defaults,
// both sent envoyBenchConfig's one descriptor (remote_address) over
// keyBytesN addresses through Envoy's RLS gRPC, 1,000 an hour
// (envoyBytesConfig). The library: drip.New on redisstore.Open's defaults
// against redis_rate (Allow), keys "user:N", 10 an hour (each key lives
// minutes in both).
// PostgreSQL: pgstore's table and its indexes (pg_total_relation_size)
// after keyBytesN keys, per key. The memory store's figures are
// BenchmarkIdleBucket's.

import (
	"context"
	"strconv"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/go-redis/redis_rate/v10"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/store/redisstore"
)

const keyBytesN = 100_000

// envoyBytesConfig is envoyBenchConfig's descriptor by the hour: the
// peer names a key after its window, which would end (and its keys
// expire) while they are counted under a limit per second.
const envoyBytesConfig = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 1000
`

// redisUsedMemory is INFO memory's used_memory.
func redisUsedMemory(b *testing.B, url string) int64 {
	b.Helper()
	info, err := redisGoClient(b, url, 1).Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("INFO memory: no used_memory")
	return 0
}

// redisKeyReport reports the keys under prefix: their count, one of
// them, and the mean MEMORY USAGE of up to 1,000. It returns the count.
func redisKeyReport(b *testing.B, url, prefix string) int {
	b.Helper()
	c := redisGoClient(b, url, 1)
	ctx := context.Background()
	var cursor uint64
	var sample []string
	n := 0
	for {
		keys, next, err := c.Scan(ctx, cursor, prefix+"*", 10000).Result()
		if err != nil {
			b.Fatal(err)
		}
		n += len(keys)
		for _, k := range keys {
			if len(sample) < 1000 {
				sample = append(sample, k)
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	if n < keyBytesN {
		b.Fatalf("%d keys under %q, want at least %d", n, prefix, keyBytesN)
	}
	var sum int64
	for _, k := range sample {
		u, err := c.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			b.Fatal(err)
		}
		sum += u
	}
	k := sample[0]
	typ, _ := c.Type(ctx, k).Result()
	ttl, _ := c.TTL(ctx, k).Result()
	enc, _ := c.ObjectEncoding(ctx, k).Result()
	b.Logf("%s: %q, %s (%s), TTL %v, MEMORY USAGE mean %.1f bytes over %d keys", prefix, k, typ, enc, ttl, float64(sum)/float64(len(sample)), len(sample))
	b.ReportMetric(float64(sum)/float64(len(sample)), "memory-usage-B/key")
	return n
}

// redisBytes reports used_memory's growth per key while fill writes
// keyBytesN keys under prefix.
func redisBytes(b *testing.B, url, prefix string, fill func()) {
	b.Helper()
	redisClean(b, url)
	redisDel(b, url, prefix)
	before := redisUsedMemory(b, url)
	fill()
	after := redisUsedMemory(b, url)
	// Per key held: a window that turned during the fill leaves the peer
	// some keys more.
	n := redisKeyReport(b, url, prefix)
	b.ReportMetric(float64(after-before)/float64(n), "used-memory-B/key")
	redisClean(b, url)
	redisDel(b, url, prefix)
	b.ReportMetric(0, "ns/op")
}

// redisDel deletes the keys under prefix.
func redisDel(b *testing.B, url, prefix string) {
	b.Helper()
	c := redisGoClient(b, url, 1)
	ctx := context.Background()
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, prefix+"*", 10000).Result()
		if err != nil {
			b.Fatal(err)
		}
		if len(keys) > 0 {
			if err := c.Del(ctx, keys...).Err(); err != nil {
				b.Fatal(err)
			}
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}

// fillParallel calls f for i in [0, keyBytesN) from 64 goroutines.
func fillParallel(b *testing.B, f func(i int) error) {
	b.Helper()
	const workers = 64
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := w; i < keyBytesN; i += workers {
				if err := f(i); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRedisBytes(b *testing.B) {
	url := redisURL(b)
	b.Run("envoy/drip", func(b *testing.B) {
		s, err := redisstore.Open(url, redisstore.WithPrefix("bench:drip:"))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		client := rlsv3.NewRateLimitServiceClient(startEnvoyStoreWith(b, s, envoyDeadline, envoyBytesConfig))
		reqs := envoyRequestsOver(keyBytesN, 1)
		for range b.N {
			redisBytes(b, url, "bench:drip:", func() {
				fillParallel(b, func(i int) error { _, err := client.ShouldRateLimit(context.Background(), reqs[i]); return err })
			})
		}
	})
	b.Run("envoy/envoyproxy-ratelimit", func(b *testing.B) {
		client := rlsv3.NewRateLimitServiceClient(startEnvoyPeerWith(b, url, envoyBytesConfig))
		reqs := envoyRequestsOver(keyBytesN, 1)
		for range b.N {
			redisBytes(b, url, "bench:rl:", func() {
				fillParallel(b, func(i int) error { _, err := client.ShouldRateLimit(context.Background(), reqs[i]); return err })
			})
		}
	})
	b.Run("library/drip", func(b *testing.B) {
		s, err := redisstore.Open(url, redisstore.WithPrefix("bench:drip:"))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		l := drip.New(s, drip.PerHour(10))
		for range b.N {
			redisBytes(b, url, "bench:drip:", func() {
				fillParallel(b, func(i int) error { _, err := l.Take(context.Background(), "user:"+strconv.Itoa(i)); return err })
			})
		}
	})
	b.Run("library/redis_rate", func(b *testing.B) {
		l := redis_rate.NewLimiter(redisGoClient(b, url, 64))
		for range b.N {
			redisBytes(b, url, "rate:bench:rr:", func() {
				fillParallel(b, func(i int) error {
					_, err := l.Allow(context.Background(), "bench:rr:user:"+strconv.Itoa(i), redis_rate.PerHour(10))
					return err
				})
			})
		}
	})
}

// BenchmarkPostgresBytes reports pgstore's table and its indexes per key
// (pg_total_relation_size of drip.buckets after keyBytesN keys "user:N",
// less before), pgstore.Open's defaults.
func BenchmarkPostgresBytes(b *testing.B) {
	url := pgURL(b)
	s, err := pgstore.Open(context.Background(), url, pgstore.WithInstall(pgstore.InstallOptions{}))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	db := pgPool(b, url, 1, "")
	size := func() int64 {
		var n int64
		if err := db.QueryRow(context.Background(), "SELECT pg_total_relation_size('drip.buckets')").Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	l := drip.New(s, drip.PerSecond(100))
	for range b.N {
		pgExec(b, db, "TRUNCATE drip.buckets")
		before := size()
		fillParallel(b, func(i int) error {
			_, err := l.Take(context.Background(), "user:"+strconv.Itoa(i))
			return err
		})
		pgExec(b, db, "VACUUM drip.buckets")
		var rows int64
		if err := db.QueryRow(context.Background(), "SELECT count(*) FROM drip.buckets").Scan(&rows); err != nil {
			b.Fatal(err)
		}
		if rows != keyBytesN {
			b.Fatalf("%d rows, want %d", rows, keyBytesN)
		}
		b.ReportMetric(float64(size()-before)/keyBytesN, "table+index-B/key")
		b.ReportMetric(0, "ns/op")
	}
}
