package server

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/driplimit/drip/store/memstore"
)

// TestGatewayForwards: the upstream learns the client drip keyed on.
// Behind a trusted proxy the chain it sent is passed on with the peer
// appended (the upstream had received only the peer); from anyone else, a
// client's own forwarding headers are replaced, never passed on.
func TestGatewayForwards(t *testing.T) {
	const rule = `{"name": "per-ip", "limit_keys": ["ip:address"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}}`
	cases := []struct {
		name, trusted string
		in            []string // request headers, name then value
		want          map[string]string
	}{
		{"trusted peer", `["127.0.0.1/32"]`,
			[]string{"X-Forwarded-For", "1.1.1.1, 5.5.5.99", "X-Real-IP", "6.6.6.6", "Forwarded", "for=6.6.6.6", "X-Forwarded-Proto", "https"},
			map[string]string{
				"X-Forwarded-For":   "1.1.1.1, 5.5.5.99, 127.0.0.1",
				"X-Real-IP":         "5.5.5.99",
				"X-Forwarded-Proto": "https",
				"Forwarded":         `for=1.1.1.1, for=5.5.5.99, for=127.0.0.1;host="drip.test";proto=https`,
			}},
		{"trusted peer, two header lines and an IPv6 client", `["127.0.0.1/32"]`,
			[]string{"X-Forwarded-For", "junk", "X-Forwarded-For", "2001:db8::7"},
			map[string]string{
				"X-Forwarded-For": "junk, 2001:db8::7, 127.0.0.1",
				"X-Real-IP":       "2001:db8::7",
				"Forwarded":       `for=unknown, for="[2001:db8::7]", for=127.0.0.1;host="drip.test";proto=http`,
			}},
		{"trusted peer, a proto that is not a scheme", `["127.0.0.1/32"]`,
			[]string{"X-Forwarded-For", "1.1.1.1", "X-Forwarded-Proto", "http;for=6.6.6.6, for=5.5.5.5"},
			map[string]string{
				"X-Forwarded-For":   "1.1.1.1, 127.0.0.1",
				"X-Forwarded-Proto": "", // not passed on
				"Forwarded":         `for=1.1.1.1, for=127.0.0.1;host="drip.test"`,
			}},
		{"trusted peer, a scheme with + - .", `["127.0.0.1/32"]`,
			[]string{"X-Forwarded-Proto", "coap+tcp-1.x"},
			map[string]string{
				"X-Forwarded-Proto": "coap+tcp-1.x",
				"Forwarded":         `for=127.0.0.1;host="drip.test";proto=coap+tcp-1.x`,
			}},
		{"no trusted proxies", `[]`,
			[]string{"X-Forwarded-For", "1.1.1.1, 5.5.5.99", "X-Real-IP", "6.6.6.6", "Forwarded", "for=6.6.6.6", "X-Forwarded-Proto", "https"},
			map[string]string{
				"X-Forwarded-For":   "127.0.0.1",
				"X-Real-IP":         "127.0.0.1",
				"X-Forwarded-Proto": "http",
				"Forwarded":         `for=127.0.0.1;host="drip.test";proto=http`,
			}},
		{"peer not trusted", `["10.0.0.0/8"]`,
			[]string{"X-Forwarded-For", "5.5.5.99"},
			map[string]string{
				"X-Forwarded-For": "127.0.0.1",
				"X-Real-IP":       "127.0.0.1",
				"Forwarded":       `for=127.0.0.1;host="drip.test";proto=http`,
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t)
			path := filepath.Join(t.TempDir(), "rules.json")
			writeFile(t, path, `{"trusted_proxies": `+tc.trusted+`, "rules": [`+rule+`]}`)
			srv := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1}, memstore.New())
			req, _ := http.NewRequest("GET", srv.base+"/", nil)
			req.Host = "drip.test"
			for i := 0; i+1 < len(tc.in); i += 2 {
				req.Header.Add(tc.in[i], tc.in[i+1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			got := up.lastHeader()
			for h, want := range tc.want {
				if v := strings.Join(got.Values(h), " | "); v != want {
					t.Errorf("upstream saw %s %q, want %q", h, v, want)
				}
			}
		})
	}
}
