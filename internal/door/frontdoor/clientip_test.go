package frontdoor

import (
	"net/netip"
	"strings"
	"testing"
)

// FuzzClientIP reads arbitrary peers and X-Forwarded-For headers: never a
// panic, never an address the request did not carry, and never the header
// when the peer is not a trusted proxy.
func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1:80", "198.51.100.1, 10.0.0.2")
	f.Add("192.0.2.1:80", "198.51.100.1")
	f.Add("[2001:db8::1]:80", "[::1]:9, x, ::ffff:1.2.3.4")
	f.Add("10.0.0.1:80", ",,, ,")
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	f.Fuzz(func(t *testing.T, remote, xff string) {
		a, ok := ClientIP(remote, []string{xff}, trusted)
		peer, pok := parseAddr(remote)
		if ok != pok {
			t.Fatalf("ok %v for peer %q", ok, remote)
		}
		if !ok {
			return
		}
		if !isTrusted(peer, trusted) && a != peer {
			t.Fatalf("untrusted peer %v, client %v from %q", peer, a, xff)
		}
		if a != peer {
			found := false
			for _, e := range strings.Split(xff, ",") {
				if x, ok := parseAddr(strings.TrimSpace(e)); ok && x == a {
					found = true
				}
			}
			if !found {
				t.Fatalf("client %v is not in %q", a, xff)
			}
		}
		if a, ok := ClientIP(remote, []string{xff}, nil); !ok || a != peer {
			t.Fatalf("without trusted proxies: %v", a)
		}
		_ = KeyIP(a, 64)
	})
}
