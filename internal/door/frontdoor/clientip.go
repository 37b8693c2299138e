package frontdoor

import (
	"net/netip"
	"strings"
)

// ClientIP returns the address of the client of a request that came from
// peerAddr ("ip:port") with the X-Forwarded-For header values xff. It is the
// peer address unless that peer is one of the trusted proxies; then
// X-Forwarded-For is read from right to left, skipping trusted hops,
// and the first address not trusted is the client. If every hop is
// trusted, the leftmost is the client; if an entry cannot be parsed, the
// last good address before it is. With no trusted proxies the header is
// never read: a client cannot choose its own key. ok is false when the
// peer address itself is not an IP (a Unix socket).
func ClientIP(peerAddr string, xff []string, trusted []netip.Prefix) (netip.Addr, bool) {
	peer, ok := parseAddr(peerAddr)
	if !ok {
		return netip.Addr{}, false
	}
	if len(trusted) == 0 || !isTrusted(peer, trusted) {
		return peer, true
	}
	client := peer
	for i := len(xff) - 1; i >= 0; i-- {
		line := xff[i]
		for line != "" {
			var entry string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				entry, line = line[j+1:], line[:j]
			} else {
				entry, line = line, ""
			}
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue
			}
			a, ok := parseAddr(entry)
			if !ok {
				return client, true
			}
			client = a
			if !isTrusted(a, trusted) {
				return client, true
			}
		}
	}
	return client, true
}

// FromTrustedProxy reports whether the peer at peerAddr ("ip:port") is
// one of the trusted proxies: whether its forwarding headers are believed.
func FromTrustedProxy(peerAddr string, trusted []netip.Prefix) bool {
	peer, ok := parseAddr(peerAddr)
	return ok && isTrusted(peer, trusted)
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseAddr reads "ip", "ip:port", "[ipv6]" or "[ipv6]:port", dropping
// any zone and unmapping IPv4-mapped IPv6.
func parseAddr(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().WithZone("").Unmap(), true
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.WithZone("").Unmap(), true
}

// KeyIP is the key value of a client address: an IPv4 address as is, an
// IPv6 address as its prefix of v6bits ("2001:db8:1:2::/64"), because one
// IPv6 client usually holds a whole /64 and could otherwise take a new
// bucket per request.
func KeyIP(a netip.Addr, v6bits int) string {
	if a.Is4() || v6bits <= 0 || v6bits >= 128 {
		return a.String()
	}
	p, err := a.Prefix(v6bits)
	if err != nil {
		return a.String()
	}
	return p.String()
}
