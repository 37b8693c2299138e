package httplimit

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	for _, c := range []struct {
		remote  string
		xff     []string
		trusted []netip.Prefix
		want    string
	}{
		{"192.0.2.1:1234", nil, nil, "192.0.2.1"},
		{"192.0.2.1:1234", []string{"198.51.100.7"}, nil, "192.0.2.1"},       // never trusted by default
		{"192.0.2.1:1234", []string{"198.51.100.7"}, trusted, "192.0.2.1"},   // peer not a proxy
		{"10.1.1.1:1234", []string{"198.51.100.7"}, trusted, "198.51.100.7"}, // one trusted hop
		{"10.1.1.1:1234", []string{"1.1.1.1, 198.51.100.7"}, trusted, "198.51.100.7"},
		{"10.1.1.1:1234", []string{"1.1.1.1, 198.51.100.7, 10.2.2.2"}, trusted, "198.51.100.7"},   // right to left, skipping trusted hops
		{"10.1.1.1:1234", []string{"1.1.1.1", "198.51.100.7, 10.2.2.2"}, trusted, "198.51.100.7"}, // several header lines
		{"10.1.1.1:1234", []string{"10.3.3.3, 10.2.2.2"}, trusted, "10.3.3.3"},                    // all trusted: the leftmost
		{"10.1.1.1:1234", []string{"198.51.100.7, garbage, 10.2.2.2"}, trusted, "10.2.2.2"},       // garbage: the last good hop
		{"10.1.1.1:1234", []string{"[2001:db8::7]:443"}, trusted, "2001:db8::7"},
		{"10.1.1.1:1234", []string{"198.51.100.7:8080"}, trusted, "198.51.100.7"},
		{"10.1.1.1:1234", []string{" , "}, trusted, "10.1.1.1"},
		{"10.1.1.1:1234", nil, trusted, "10.1.1.1"},
		{"[2001:db8:ffff::1]:1234", []string{"::ffff:198.51.100.9"}, trusted, "198.51.100.9"}, // 4in6 unmapped
		{"[fe80::1%eth0]:1234", nil, nil, "fe80::1"},
		{"192.0.2.1", nil, nil, "192.0.2.1"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.remote
		for _, x := range c.xff {
			r.Header.Add("X-Forwarded-For", x)
		}
		a, ok := ClientIP(r, c.trusted)
		if !ok || a.String() != c.want {
			t.Errorf("ClientIP(%s, %q) = %v, %v; want %s", c.remote, c.xff, a, ok, c.want)
		}
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "@"
	if _, ok := ClientIP(r, nil); ok {
		t.Error("a unix socket peer has an IP")
	}
}

func TestKeyIP(t *testing.T) {
	for _, c := range []struct {
		ip   string
		bits int
		want string
	}{
		{"192.0.2.1", 64, "192.0.2.1"},
		{"2001:db8:1:2:3:4:5:6", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff::1", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:3:4:5:6", 48, "2001:db8:1::/48"},
		{"2001:db8:1:2:3:4:5:6", 128, "2001:db8:1:2:3:4:5:6"},
	} {
		if got := KeyIP(netip.MustParseAddr(c.ip), c.bits); got != c.want {
			t.Errorf("KeyIP(%s, %d) = %s, want %s", c.ip, c.bits, got, c.want)
		}
	}
}

// FuzzDecide runs whole requests with arbitrary header values through the
// middleware: no panic, and every answer is an allow, a well-formed 429 or
// the 400 of an ambiguous path.
func FuzzDecide(f *testing.F) {
	f.Add("/api/x", "5", "198.51.100.1, 10.0.0.2", "Bearer a.b.c", "k")
	f.Add("/a/../api/", "abc", "garbage", "bearer ", "")
	f.Add("/%61pi;x/\x00", "1", "", "", "k")
	f.Add("/", "99999", "", "Basic x", "k|x")
	set, err := rules.Parse([]byte(`{"trusted_proxies": ["10.0.0.0/8"], "jwt": {"verify": false}, "rules": [
		{"name": "t", "group": "g", "limit_keys": ["jwt:sub"], "match": {"jwt:plan": "pro"}, "algorithm_config": {"rps": 5, "burst": 10}},
		{"name": "k", "group": "g", "limit_keys": ["header:x-key", "ip:address"], "match": {"path": "/api/*"},
		 "algorithm_config": {"rps": 1, "burst": 3, "cost_source": "header:x-weight", "default_cost": 1}},
		{"name": "s", "mode": "shadow", "limit_keys": ["path"], "algorithm": "fixed_window", "algorithm_config": {"rate": 2, "period": "1m"}}]}`), "f.json")
	if err != nil {
		f.Fatal(err)
	}
	l := New(memstore.New(), set, WithLogger(slog.New(slog.DiscardHandler)))
	f.Fuzz(func(t *testing.T, path, weight, xff, auth, key string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.URL.Path = path
		r.RemoteAddr = "10.0.0.1:5"
		r.Header.Set("X-Weight", weight)
		r.Header.Set("X-Forwarded-For", xff)
		r.Header.Set("Authorization", auth)
		r.Header.Set("X-Key", key)
		res := l.Decide(context.Background(), r)
		rec := httptest.NewRecorder()
		WriteHeaders(rec.Header(), res)
		if res.Allowed {
			if Status(res) != 0 || res.RetryAfter != 0 {
				t.Fatalf("allowed with %+v", res)
			}
			return
		}
		WriteError(rec, res)
		if Status(res) == 400 {
			// A path servers read in different ways: refused, nothing taken.
			if res.Reason != ReasonAmbiguousPath || res.Top != nil || rec.Header().Get("RateLimit-Policy") != "" {
				t.Fatalf("refused: %d %v %+v", rec.Code, rec.Header(), res)
			}
			return
		}
		if rec.Code != 429 || res.Top == nil || rec.Header().Get("RateLimit-Policy") == "" {
			t.Fatalf("denied: %d %v %+v", rec.Code, rec.Header(), res)
		}
		if res.Reason != engine.ReasonCostExceedsBurst && res.RetryAfter < 1 {
			t.Fatalf("Retry-After %d", res.RetryAfter)
		}
	})
}
