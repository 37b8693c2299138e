package httplimit

import (
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strings"

	"github.com/driplimit/drip/internal/frontdoor"
	"github.com/driplimit/drip/rules"
)

// reqValues reads a request's values, each at most once: the client IP,
// headers and verified claims as every front door does (frontdoor), and
// the query, path, method and cookies of HTTP.
type reqValues struct {
	frontdoor.Request
	r *http.Request

	queryDone bool
	query     url.Values

	pathDone bool
	path     string
}

func newReqValues(s *frontdoor.Snapshot, r *http.Request) *reqValues {
	return &reqValues{Request: frontdoor.Request{S: s, Peer: r.RemoteAddr, Header: r.Header}, r: r}
}

func (v *reqValues) Value(src rules.Source) (string, bool) {
	switch src.Kind {
	case rules.KindQuery:
		if !v.queryDone {
			v.query, v.queryDone = v.r.URL.Query(), true
		}
		return frontdoor.Joined(v.query[src.Name])
	case rules.KindPath:
		return v.cleanPath(), true
	case rules.KindMethod:
		return v.r.Method, true
	case rules.KindCookie:
		var vals []string
		for _, c := range v.r.CookiesNamed(src.Name) {
			vals = append(vals, c.Value)
		}
		return frontdoor.Joined(vals)
	}
	return v.Request.Value(src)
}

// cleanPath is the URL path as the upstream will route it: "/a/../b" is
// "/b", so that a match on "/api/*" cannot be dodged; a trailing slash is
// kept, and so is the one a last segment "." or ".." leaves ("/api/x/.."
// is "/api/", as RFC 3986 removes dot segments and nginx routes it, where
// path.Clean would make it "/api", out of "/api/*").
func (v *reqValues) cleanPath() string {
	if !v.pathDone {
		p := v.r.URL.Path
		switch {
		case p == "":
			v.path = "/"
		case p[0] != '/':
			v.path = p // "*" of OPTIONS *
		default:
			v.path = path.Clean(p)
			dir := strings.HasSuffix(p, "/") || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..")
			if dir && v.path != "/" {
				v.path += "/"
			}
		}
		v.pathDone = true
	}
	return v.path
}

// ClientIP returns the address of the client that sent r. It is the peer
// address (r.RemoteAddr) unless that peer is one of the trusted proxies;
// then X-Forwarded-For is read from right to left, skipping trusted hops,
// and the first address not trusted is the client. If every hop is
// trusted, the leftmost is the client; if an entry cannot be parsed, the
// last good address before it is. With no trusted proxies the header is
// never read: a client cannot choose its own key. ok is false when the
// peer address itself is not an IP (a Unix socket).
func ClientIP(r *http.Request, trusted []netip.Prefix) (netip.Addr, bool) {
	return frontdoor.ClientIP(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), trusted)
}

// FromTrustedProxy reports whether r's peer (r.RemoteAddr) is one of the
// trusted proxies: whether its forwarding headers are believed.
func FromTrustedProxy(r *http.Request, trusted []netip.Prefix) bool {
	return frontdoor.FromTrustedProxy(r.RemoteAddr, trusted)
}

// KeyIP is the key value of a client address: an IPv4 address as is, an
// IPv6 address as its prefix of v6bits ("2001:db8:1:2::/64"), because one
// IPv6 client usually holds a whole /64 and could otherwise take a new
// bucket per request.
func KeyIP(a netip.Addr, v6bits int) string { return frontdoor.KeyIP(a, v6bits) }
