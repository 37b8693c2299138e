package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/redisstore"
)

// BenchmarkApply is one caller's store call, a take of one key (without
// batching: one call of the function) and of two keys (one call, all or
// nothing, as an Envoy request of two descriptors makes), on 1,000 keys
// under a limit that always allows: the client's time and allocations
// per call, the server's round trip included, and the server's CPU per
// call (srv-µs/op: INFO commandstats, the function calls' time on a
// server of the benchmark's own).
//
//	CI=true go test -run '^$' -bench Apply -benchmem ./store/redisstore/
func BenchmarkApply(b *testing.B) {
	r := testserver.StartRedis(b)
	s := open(b, r.URL(), redisstore.WithoutBatching(), redisstore.WithPrefix(randomTag()+":"))
	params := bucket.Params{Rate: 1e12, Period: 1e9, Burst: 1e12}
	for _, n := range []int{1, 2} {
		b.Run("keys="+strconv.Itoa(n), func(b *testing.B) {
			items := make([][]bucket.Prepared, 1000)
			for i := range items {
				for k := range n {
					items[i] = append(items[i], bucket.Prepared{Key: "k" + strconv.Itoa(i) + ":" + strconv.Itoa(k), Params: params, Cost: 1e6})
				}
			}
			res := make([]bucket.Result, n)
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			b.ReportAllocs()
			calls0, usec0 := fcallStats(b, r)
			for i := 0; b.Loop(); i++ {
				if err := s.Apply(ctx, bucket.Take, time.Time{}, items[i%len(items)], res); err != nil {
					b.Fatal(err)
				}
				if !res[0].Allowed {
					b.Fatal("denied")
				}
			}
			calls, usec := fcallStats(b, r)
			if calls > calls0 {
				b.ReportMetric((usec-usec0)/(calls-calls0), "srv-µs/op")
			}
		})
	}
}

// fcallStats is how many function calls the server ran and the
// microseconds they took (INFO commandstats).
func fcallStats(b *testing.B, r *testserver.Redis) (calls, usec float64) {
	b.Helper()
	out, err := r.Cli("INFO", "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_fcall:")
		if !ok {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				calls = x
			case "usec":
				usec = x
			}
		}
	}
	return calls, usec
}
