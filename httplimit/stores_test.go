package httplimit_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// TestStores runs the key end-to-end cases on every store: the memory
// store, PostgreSQL and Redis, each started by the test harness. The
// middleware makes the same decisions, headers included, on all three.
func TestStores(t *testing.T) {
	// On Redis Cluster the rules' keys land in different hash slots; the
	// store says so (store.ErrNotColocated) and the limiter takes the
	// enforce rules one call each, with no option needed.
	for _, st := range teststores.Shared() {
		t.Run(st.Name, func(t *testing.T) {
			store := st.Open(t)
			for _, c := range storeCases {
				t.Run(c.name, func(t *testing.T) { c.run(t, &storeUnder{store, nil}) })
			}
		})
	}
}

// runID keeps this run's buckets apart from those of earlier runs on a
// shared server (DRIP_TEST_POSTGRES_URL, DRIP_TEST_REDIS_URL).
func runID() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// storeEnv serves rules whose {id} is replaced by a fresh run id, with
// time starting now (shared stores sweep by their own clock).
func storeEnv(t *testing.T, su *storeUnder, src string) (*env, string) {
	id := runID()
	e := newEnv(t, su.store, parse(t, strings.ReplaceAll(src, "{id}", id)), su.opts...)
	e.clock.Set(time.Now())
	t.Cleanup(func() {
		if n := e.obs.errs(); n != 0 {
			t.Errorf("%d store calls failed: the decisions were on_error's, not the store's", n)
		}
	})
	return e, id
}

// storeUnder is a store and the limiter options it needs.
type storeUnder struct {
	store store.Store
	opts  []httplimit.Option
}

var storeCases = []struct {
	name string
	run  func(t *testing.T, s *storeUnder)
}{
	{"headers and 429 after the burst", func(t *testing.T, s *storeUnder) {
		e, id := storeEnv(t, s, `{"rules": [{"name": "free-{id}", "limit_keys": ["header:x-api-key"],
			"algorithm_config": {"rps": 10, "burst": 20}}]}`)
		name := `"free-` + id + `"`
		r := e.do("/", "X-Api-Key: k")
		if r.h.Get("RateLimit-Policy") != name+";q=20;w=2" || r.h.Get("RateLimit") != name+";r=19;t=1" ||
			r.h.Get("RateLimit-Limit") != "20" || r.h.Get("RateLimit-Remaining") != "19" || r.h.Get("RateLimit-Reset") != "1" {
			t.Fatalf("first: %v", r.h)
		}
		for range 12 {
			e.do("/", "X-Api-Key: k")
		}
		if r := e.do("/", "X-Api-Key: k"); r.h.Get("RateLimit") != name+";r=6;t=2" {
			t.Fatalf("14th: %v", r.h)
		}
		for range 6 {
			if r := e.do("/", "X-Api-Key: k"); r.code != 200 {
				t.Fatalf("%d", r.code)
			}
		}
		r = e.do("/", "X-Api-Key: k")
		ra, _ := strconv.Atoi(r.h.Get("Retry-After"))
		if r.code != 429 || ra < 1 || ra > 2 || r.h.Get("RateLimit") != fmt.Sprintf("%s;r=0;t=%d", name, ra) {
			t.Fatalf("21st: %d %v", r.code, r.h)
		}
		if p := r.problem(t); p.Reason != "token_bucket_exceeded" || p.Rule != "free-"+id {
			t.Errorf("problem %+v", p)
		}
		if e.hits.Load() != 20 {
			t.Errorf("upstream saw %d", e.hits.Load())
		}
	}},
	{"Retry-After per client", func(t *testing.T, s *storeUnder) {
		e, _ := storeEnv(t, s, `{"trusted_proxies": ["127.0.0.1", "::1"], "rules": [{"name": "slow-{id}",
			"limit_keys": ["ip:address"], "algorithm_config": {"rate": 1, "period": "1m", "burst": 1}}]}`)
		seen := map[string]bool{}
		for i := range 6 {
			ip := fmt.Sprintf("198.51.100.%d", i+1)
			e.do("/", "X-Forwarded-For: "+ip)
			r1, r2 := e.do("/", "X-Forwarded-For: "+ip), e.do("/", "X-Forwarded-For: "+ip)
			want := strconv.FormatInt((rules.Jitter{Fraction: 0.5, Max: math.MaxInt64}).Seconds("ip:"+ip, time.Minute), 10)
			if r1.code != 429 || r1.h.Get("Retry-After") != want || r2.h.Get("Retry-After") != want {
				t.Fatalf("%s: %d Retry-After %q %q, want %s", ip, r1.code, r1.h.Get("Retry-After"), r2.h.Get("Retry-After"), want)
			}
			seen[want] = true
		}
		if len(seen) < 3 {
			t.Errorf("6 clients, %d distinct Retry-After values", len(seen))
		}
	}},
	{"cost", func(t *testing.T, s *storeUnder) {
		e, _ := storeEnv(t, s, `{"rules": [{"name": "w-{id}", "limit_keys": ["header:x-api-key"],
			"algorithm_config": {"rate": 1, "period": "1h", "burst": 20, "cost_source": "header:x-weight", "default_cost": 2}}]}`)
		for _, c := range []struct {
			w    string
			want int
		}{{"5", 15}, {"abc", 13}, {"-3", 11}, {"", 9}, {"25", 9}} {
			h := []string{"X-Api-Key: k"}
			if c.w != "" {
				h = append(h, "X-Weight: "+c.w)
			}
			r := e.do("/", h...)
			if r.remaining(t) != c.want || (c.w == "25") != (r.code == 429) {
				t.Fatalf("weight %q: %d remaining %d, want %d", c.w, r.code, r.remaining(t), c.want)
			}
		}
	}},
	{"a key limiter shares the bucket of its rule", func(t *testing.T, s *storeUnder) {
		e, id := storeEnv(t, s, `{"rules": [{"name": "kf-{id}", "limit_keys": ["header:x-user"], "algorithm_config": {"rps": 10, "burst": 20}}]}`)
		opts := append([]httplimit.Option{engine.WithTimeout(teststores.Timeout), engine.WithClock(e.clock.Now), engine.WithObserver(e.obs)}, s.opts...)
		k, err := httplimit.NewKeyLimiter(s.store, httplimit.KeyLimit{Name: "kf-" + id, Limit: drip.PerSecond(10).WithBurst(20), Key: headerKey}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		h := k.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		name := `"kf-` + id + `"`
		for i := range 20 {
			var r resp
			if i%2 == 0 {
				r = e.do("/", "X-User: ann")
			} else {
				r = record(h, userReq("ann", ""))
			}
			if r.code != 200 || r.remaining(t) != 19-i || r.h.Get("RateLimit-Policy") != name+";q=20;w=2" {
				t.Fatalf("request %d: %d %v", i, r.code, r.h)
			}
		}
		r := record(h, userReq("ann", ""))
		ra, _ := strconv.Atoi(r.h.Get("Retry-After"))
		if r.code != 429 || ra < 1 || ra > 2 || r.h.Get("RateLimit") != fmt.Sprintf("%s;r=0;t=%d", name, ra) {
			t.Fatalf("21st: %d %v", r.code, r.h)
		}
		if r := e.do("/", "X-User: ann"); r.code != 429 {
			t.Fatalf("22nd, by the rule: %d %v", r.code, r.h)
		}
	}},
	{"spoofed X-Forwarded-For", func(t *testing.T, s *storeUnder) {
		e, _ := storeEnv(t, s, `{"rules": [{"name": "ip-{id}", "limit_keys": ["ip:address"], "algorithm_config": {"rps": 1, "burst": 5}}]}`)
		e.do("/", "X-Forwarded-For: 203.0.113.1")
		if r := e.do("/", "X-Forwarded-For: 203.0.113.2"); r.remaining(t) != 3 {
			t.Errorf("a spoofed header changed the bucket: remaining %d", r.remaining(t))
		}
	}},
	{"all or nothing, shadow", func(t *testing.T, s *storeUnder) {
		e, id := storeEnv(t, s, `{"rules": [
			{"name": "ip-{id}", "limit_keys": ["ip:address"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 10}},
			{"name": "key-{id}", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 2}},
			{"name": "watch-{id}", "mode": "shadow", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 2}}]}`)
		for range 2 {
			if r := e.do("/", "X-Api-Key: a"); r.code != 200 {
				t.Fatalf("%d", r.code)
			}
		}
		// The ip rule shows as it is: 8 left (in one multi-take, or taken
		// then refunded when the takes are separate).
		if r := e.do("/", "X-Api-Key: a"); r.code != 429 || r.problem(t).Rule != "key-"+id ||
			!strings.Contains(r.h.Get("RateLimit"), `"ip-`+id+`";r=8;`) {
			t.Fatalf("%d %v", r.code, r.h)
		}
		r := e.do("/", "X-Api-Key: b")
		if r.code != 200 || !strings.Contains(r.h.Get("RateLimit"), `"ip-`+id+`";r=7;`) {
			t.Fatalf("the denied request took from the ip rule: %v", r.h)
		}
		if e.obs.count("watch-"+id+"/shadow/denied") != 2 || e.obs.count("watch-"+id+"/shadow/allowed") != 2 {
			t.Errorf("shadow %v", e.obs.decisions)
		}
	}},
}
