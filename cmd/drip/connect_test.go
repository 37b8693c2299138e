package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/pgstore"
)

// storeDownRules is a gateway's rules file: one rule of burst 2 per API
// key, failing as onError says.
func storeDownRules(t *testing.T, onError string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	body := fmt.Sprintf("on_error: %s\nrules:\n  - name: per-key\n    limit_keys: [header:x-api-key]\n    algorithm_config: {rate: 2, period: 1h, burst: 2}\n", onError)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// gatewayCodes sends n requests with API key key through the gateway at
// api and returns their statuses.
func gatewayCodes(t *testing.T, api, key string, n int) []int {
	t.Helper()
	var codes []int
	for range n {
		req, err := http.NewRequest("GET", "http://"+api+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Api-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	return codes
}

// readyz returns /readyz's status and body.
func readyz(t *testing.T, admin string) (int, string) {
	t.Helper()
	return httpDo(t, "GET", "http://"+admin+"/readyz", "")
}

// downStore is a store that does not answer: its URL, what makes it
// answer, and how many keys it holds.
type downStore struct {
	url  string
	up   func()
	keys func() int
}

// dbsize is the number of keys of a Redis server.
func dbsize(t *testing.T, r *testserver.Redis) int {
	out, err := r.Cli("DBSIZE")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("DBSIZE: %q", out)
	}
	return n
}

// paused pauses servers until up resumes them (and before the test
// stops them).
func paused(t *testing.T, servers ...*testserver.Redis) (up func()) {
	for _, r := range servers {
		if err := r.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	up = func() {
		for _, r := range servers {
			if err := r.Resume(); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(up) // SIGCONT again is harmless
	return up
}

// storesDown are the stores drip serve starts without: nothing on the
// port of a Redis server until it starts there; a Redis server, a Redis
// Cluster's nodes and a Sentinel set's Sentinels paused (connections
// accepted, nothing answers); a PostgreSQL server stopped, whose schema
// drip installs (drip_install) once it answers, before any decision.
var storesDown = map[string]func(t *testing.T) downStore{
	"redis": func(t *testing.T) downStore {
		port := testserver.FreePort(t, 0)
		var r *testserver.Redis
		return downStore{url: "redis://127.0.0.1:" + strconv.Itoa(port),
			up: func() {
				var err error
				if r, err = testserver.LaunchRedis(t.TempDir(), port); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(r.Stop)
			},
			keys: func() int { return dbsize(t, r) }}
	},
	"redis paused": func(t *testing.T) downStore {
		r := testserver.StartRedis(t)
		return downStore{url: r.URL(), up: paused(t, r), keys: func() int { return dbsize(t, r) }}
	},
	"cluster paused": func(t *testing.T) downStore {
		c, err := testserver.LaunchRedisCluster(t.TempDir(), 3, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Stop)
		return downStore{url: c.URL(), up: paused(t, c.Nodes...), keys: func() int {
			n := 0
			for _, r := range c.Nodes {
				n += dbsize(t, r)
			}
			return n
		}}
	},
	"sentinel paused": func(t *testing.T) downStore {
		s := testserver.StartRedisSentinel(t)
		return downStore{url: s.URL(), up: paused(t, s.Sentinels...), keys: func() int { return dbsize(t, s.Master) }}
	},
	"postgres": func(t *testing.T) downStore {
		pg := testserver.StartPostgres(t)
		if pg.External() {
			t.Skip("an external PostgreSQL cannot be stopped")
		}
		if err := pg.Stop(); err != nil {
			t.Fatal(err)
		}
		return downStore{url: pg.URL() + "&drip_install=true",
			up: func() {
				if err := pg.Start(); err != nil {
					t.Fatal(err)
				}
			},
			keys: func() int {
				pool, err := pgstore.NewPool(t.Context(), pg.URL())
				if err != nil {
					t.Fatal(err)
				}
				defer pool.Close()
				var n int
				if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM drip.buckets").Scan(&n); err != nil {
					return 0 // not installed yet
				}
				return n
			}}
	},
}

// TestServeStoreDown: drip serve starts while its store does not answer,
// decides by each rule's on_error meanwhile, and /readyz says whether
// that can serve: on_error local keeps the gateway ready (and it limits
// each key locally, at half the rule's burst), as does allow; on_error
// deny does not (503), nor does the decision API (503 without its
// store). Once the store answers, decisions go to it (the rule's burst
// of 2, and keys in the store) and the instance is ready. Before, drip
// serve exited 1 at start.
func TestServeStoreDown(t *testing.T) {
	if err := testserver.RedisMissing(); err != nil {
		testserver.Missing(t, "redis: %v", err)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(upstream.Close)
	cases := []struct {
		store   string
		onError string
		gateway bool
		ready   bool // while the store does not answer
		down    []int
	}{
		{"redis", "local", true, true, []int{200, 429}},
		{"redis", "deny", true, false, []int{503, 503}},
		{"redis", "allow", true, true, []int{200, 200, 200}},
		{"redis", "local", false, false, nil}, // the decision API
		{"redis paused", "local", true, true, []int{200, 429}},
		{"cluster paused", "local", true, true, []int{200, 429}},
		{"sentinel paused", "local", true, true, []int{200, 429}},
		{"postgres", "local", true, true, []int{200, 429}},
		{"postgres", "deny", true, false, []int{503, 503}},
	}
	for _, tc := range cases {
		name := tc.store + ", " + tc.onError
		if !tc.gateway {
			name += ", decision API"
		}
		t.Run(name, func(t *testing.T) {
			// Each case its own servers and its own drip serve, mostly
			// waiting for them to start and connect: two at a time.
			t.Parallel()
			st := storesDown[tc.store](t)
			args := []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--store", st.url,
				"--rules", storeDownRules(t, tc.onError)}
			if tc.gateway {
				args = append(args, "--upstream", upstream.URL)
			}
			api, admin, _ := serveInProcess(t, args...)

			code, body := readyz(t, admin)
			if (code == 200) != tc.ready || !strings.Contains(body, "unreachable") {
				t.Fatalf("/readyz while the store does not answer: %d %s, want ready %v", code, body, tc.ready)
			}
			take := func(key string, n int) []int {
				if tc.gateway {
					return gatewayCodes(t, api, key, n)
				}
				var codes []int
				for range n {
					code, _ := httpDo(t, "POST", "http://"+api+"/v1/take", `{"rule": "per-key", "values": ["`+key+`"]}`)
					codes = append(codes, code)
				}
				return codes
			}
			if tc.gateway {
				if got := take("k1", len(tc.down)); fmt.Sprint(got) != fmt.Sprint(tc.down) {
					t.Fatalf("on_error %s while the store does not answer: %v, want %v", tc.onError, got, tc.down)
				}
			} else if got := take("k1", 1); got[0] != 503 {
				t.Fatalf("decision API while the store does not answer: %v, want 503", got)
			}

			st.up()
			// Decisions go to the store once drip has connected: each
			// key's burst is then the rule's 2, and its bucket is there.
			want := "[200 200 429]"
			if !tc.gateway {
				want = "[200 200 200]" // a denial is a 200 in the decision API
			}
			deadline := time.Now().Add(time.Minute) // generous: how soon is not tested
			for i := 0; ; i++ {
				got := take("fresh"+strconv.Itoa(i), 3)
				n := st.keys()
				if fmt.Sprint(got) == want && n > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("decisions never went to the store: %v, %d keys", got, n)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if code, body := readyz(t, admin); code != 200 || strings.Contains(body, "unreachable") {
				t.Fatalf("/readyz once the store answers: %d %s", code, body)
			}
		})
	}
}

// TestServeStoreRefuses: a store that answers and refuses (a wrong
// password) is no outage that waiting cures: drip serve exits 1 at
// start, saying why, without the password.
func TestServeStoreRefuses(t *testing.T) {
	srv := testserver.StartRedis(t, "--user", "rl", "on", ">s3cret", "~*", "&*", "+@all")
	var out, errs lockedBuffer
	code := run(t.Context(), []string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--store", "redis://rl:wrongpass@" + srv.Addr}, strings.NewReader(""), &out, &errs)
	if code != 1 || !strings.Contains(errs.String(), "WRONGPASS") || strings.Contains(out.String()+errs.String(), "wrongpass") {
		t.Fatalf("a wrong password: exit %d, stderr %s", code, errs.String())
	}
}

// TestCapsOf: the caps drip serve reports for a store it has not opened
// yet are the store's once open (but SplitsKeys, which a redis:// URL
// may set; overrides are served by the pending store).
func TestCapsOf(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg := testserver.SharedPostgres(t).URL()
	if strings.Contains(pg, "?") {
		pg += "&drip_install=true"
	} else {
		pg += "?drip_install=true"
	}
	for _, url := range []string{testserver.SharedRedisURL(t), pg} {
		st, closeStore, err := openStore(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		got, want := capsOf(url), st.Caps()
		closeStore()
		if want.Overrides == nil {
			t.Errorf("%T: the store keeps no overrides, the pending store says it does", st)
		}
		if want.Board == nil {
			t.Errorf("%T: the store keeps no board, the pending store says it does", st)
		}
		got.Overrides, want.Overrides = nil, nil
		got.Board, want.Board = nil, nil
		got.SplitsKeys = want.SplitsKeys
		if got != want {
			t.Errorf("capsOf: %+v, the store's %+v", got, want)
		}
	}
}

// TestServeStoreDownNoSecret: the logs of a store that does not answer,
// at start and in the background, never show its password.
func TestServeStoreDownNoSecret(t *testing.T) {
	url := "redis://default:s3cret@127.0.0.1:" + strconv.Itoa(testserver.FreePort(t, 0))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var out, errs lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--drain=0", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--store", url}, strings.NewReader(""), &out, &errs)
	}()
	deadline := time.Now().Add(time.Minute) // generous: how soon is not tested
	for strings.Count(errs.String(), "does not answer") < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if logs := out.String() + errs.String(); strings.Count(logs, "does not answer") < 2 || strings.Contains(logs, "s3cret") {
		t.Fatalf("want the start and an attempt in the background logged, without the password:\n%s", logs)
	}
}

var healthRe = regexp.MustCompile(`/healthcheck on http://(\S+) \(PORT\)`)

// TestRatelimitStoreDown: the Envoy drop-in, configured by
// envoyproxy/ratelimit's variables, starts while its Redis does not
// answer (before: exit 1, so a rollout during a Redis incident
// crash-looped). Its calls fail with UNAVAILABLE (Envoy applies its
// failure_mode_deny) and its /healthcheck is 500 meanwhile; once Redis
// answers, calls are decided there and /healthcheck is 200.
func TestRatelimitStoreDown(t *testing.T) {
	if err := testserver.RedisMissing(); err != nil {
		testserver.Missing(t, "redis: %v", err)
	}
	port := testserver.FreePort(t, 0)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "ratelimit", "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "ratelimit", "config", "gw.yaml"), []byte(gatewayFile), 0o644); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:" + strconv.Itoa(port),
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false",
		"CONFIG_TYPE": "FILE", "USE_STATSD": "false", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0",
		"DRIP_ADMIN_LISTEN": "127.0.0.1:0",
	} {
		t.Setenv(k, v)
	}
	out := startServe(t)
	health := healthRe.FindStringSubmatch(out)
	if health == nil {
		t.Fatalf("no /healthcheck address in %s", out)
	}
	conn, err := grpc.NewClient(grpcAnyRe.FindStringSubmatch(out)[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	req := gwRequest(map[string]string{"path": "/a"}) // limited: 3 an hour
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := c.ShouldRateLimit(ctx, req); status.Code(err) != codes.Unavailable {
		t.Fatalf("ShouldRateLimit while Redis does not answer: %v, want UNAVAILABLE", err)
	}
	if code, body := httpGet(t, "http://"+health[1]+"/healthcheck"); code != 500 {
		t.Fatalf("/healthcheck while Redis does not answer: %d %s", code, body)
	}

	srv, err := testserver.LaunchRedis(t.TempDir(), port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	waitFor(t, "decisions in Redis", func() bool {
		resp, err := c.ShouldRateLimit(ctx, req)
		return err == nil && resp.OverallCode != rlsv3.RateLimitResponse_UNKNOWN && dbsize(t, srv) > 0
	})
	if code, body := httpGet(t, "http://"+health[1]+"/healthcheck"); code != 200 {
		t.Fatalf("/healthcheck once Redis answers: %d %s", code, body)
	}
}
