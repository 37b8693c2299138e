package global

import (
	"context"
	"os"
	"testing"

	"github.com/redis/rueidis"

	"github.com/driplimit/drip/internal/testkit/testserver"
)

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

// redisClean empties the benchmark's database, so that every mode starts
// on a server that holds no key of the one before.
func redisClean(b *testing.B, url string) {
	b.Helper()
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	opt.DisableCache = true
	c, err := rueidis.NewClient(opt)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.Do(context.Background(), c.B().Flushdb().Build()).Error(); err != nil {
		b.Fatal(err)
	}
}
