package httplimit_test

import (
	"context"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/store/memstore"
)

// Concurrent requests over two rules grant exactly what the tighter one
// allows, and a denied request takes from neither, while the rules are
// swapped (a reload) again and again: no bucket state is lost.
func TestConcurrentAllOrNothingUnderReload(t *testing.T) {
	src := `{"rules": [
		{"name": "key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 50}},
		{"name": "all", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 80}}]}`
	e := newEnv(t, nil, parse(t, src))
	var allowed, denied atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	go func() { // reload continuously, in the other rule order
		alt := parse(t, `{"rules": [
			{"name": "all", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 80}},
			{"name": "key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 50}}]}`)
		orig := e.lim.Rules()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				e.lim.Swap(alt)
			} else {
				e.lim.Swap(orig)
			}
		}
	}()
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "X-Api-Key: a"
			if w%2 == 1 {
				key = "X-Api-Key: b"
			}
			for range 15 {
				switch r := e.do("/", key); r.code {
				case 200:
					allowed.Add(1)
				case 429:
					denied.Add(1)
				default:
					t.Errorf("status %d", r.code)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	// 120 requests, 60 per key: each key is held to 50, and all of them
	// to 80: 80 granted, whatever the interleaving.
	if allowed.Load() != 80 || denied.Load() != 40 || e.hits.Load() != 80 {
		t.Errorf("allowed %d, denied %d, upstream %d; want 80, 40, 80", allowed.Load(), denied.Load(), e.hits.Load())
	}
}

func TestIPv6Prefix(t *testing.T) {
	for _, c := range []struct {
		prefix string
		shared bool // whether two addresses of one /64 share a bucket
	}{{``, true}, {`"ipv6_prefix": 128,`, false}} {
		set := parse(t, `{`+c.prefix+`"rules": [{"name": "ip", "limit_keys": ["ip:address"], "algorithm_config": {"rps": 1, "burst": 5}}]}`)
		l := httplimit.New(memstore.New(), set)
		var last int64
		for _, addr := range []string{"[2001:db8:1:2::1]:5000", "[2001:db8:1:2:ffff::9]:5001"} {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = addr
			res := l.Decide(context.Background(), r)
			last = res.Top.Decision.Remaining
		}
		if (last == 3) != c.shared {
			t.Errorf("prefix %q: remaining %d after two addresses of one /64", c.prefix, last)
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "[2001:db8:1:3::1]:5000"
		if res := l.Decide(context.Background(), r); res.Top.Decision.Remaining != 4 {
			t.Errorf("another /64 shares the bucket")
		}
		l.Close()
	}
}
