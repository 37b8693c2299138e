package main

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/server"
	"github.com/driplimit/drip/store/redisstore"
)

// TestRatelimitRedis: REDIS_* as envoyproxy/ratelimit takes them reach a
// real server of each kind (one with a password, one over TLS, a Redis
// Cluster, a Sentinel set), through the store drip serve opens: a limit
// of 2 allows two takes and denies the third.
func TestRatelimitRedis(t *testing.T) {
	type env = map[string]string
	cases := []struct {
		name string
		env  func(t *testing.T) env
	}{
		{"single with a user and password", func(t *testing.T) env {
			// An ACL user beside the default one (which the harness pings).
			r := testserver.StartRedis(t, "--user", "rl", "on", ">s3cret", "~*", "&*", "+@all")
			// A wrong password is refused: the password is sent.
			e := env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": r.Addr, "REDIS_AUTH": "rl:wrong"}
			var c server.Config
			if _, err := envoyEnv(&c, environOf(e), none, false); err != nil {
				t.Fatal(err)
			}
			if _, closeStore, err := openStore(context.Background(), c.Store); err == nil {
				closeStore()
				t.Fatal("a wrong REDIS_AUTH opened the store")
			}
			return env{"REDIS_URL": r.Addr, "REDIS_AUTH": "rl:s3cret"}
		}},
		{"single over TLS", func(t *testing.T) env {
			ca := testserver.NewCA(t, "redis")
			cert, key := ca.Issue(t, ca.Dir(t), "127.0.0.1")
			_, port := testserver.StartRedisTLS(t, cert, key)
			return env{"REDIS_URL": "127.0.0.1:" + strconv.Itoa(port), "REDIS_TLS": "true", "REDIS_TLS_CACERT": ca.CAFile,
				"REDIS_TLS_CLIENT_CERT": cert, "REDIS_TLS_CLIENT_KEY": key}
		}},
		{"cluster", func(t *testing.T) env {
			u, err := url.Parse(testserver.SharedRedisClusterURL(t))
			if err != nil {
				t.Fatal(err)
			}
			return env{"REDIS_TYPE": "cluster", "REDIS_URL": strings.Join(append([]string{u.Host}, u.Query()["addr"]...), ",")}
		}},
		{"sentinel", func(t *testing.T) env {
			s := testserver.StartRedisSentinel(t)
			addrs := []string{testserver.SentinelMaster}
			for _, r := range s.Sentinels {
				addrs = append(addrs, s.ClientAddr(r))
			}
			return env{"REDIS_TYPE": "sentinel", "REDIS_URL": strings.Join(addrs, ",")}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.env(t)
			e["REDIS_SOCKET_TYPE"] = "tcp"
			e["REDIS_PIPELINE_WINDOW"] = "100us"
			var c server.Config
			st, err := envoyEnv(&c, environOf(e), none, false)
			if err != nil {
				t.Fatal(err)
			}
			var opts []redisstore.Option
			if st.batching != nil {
				opts = append(opts, redisstore.WithBatching(*st.batching))
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rs, closeStore, err := openStore(ctx, c.Store, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer closeStore()
			req := drip.Request{Key: testserver.Prefix() + "k", Limit: drip.Limit{Rate: 2, Period: time.Hour, Burst: 2}, Cost: 1}
			for i, want := range []bool{true, true, false} {
				d, err := drip.Apply(ctx, rs, bucket.Take, time.Time{}, req)
				if err != nil {
					t.Fatalf("take %d: %v", i, err)
				}
				if d.Allowed != want {
					t.Fatalf("take %d: allowed %v, want %v", i, d.Allowed, want)
				}
			}
		})
	}
}
