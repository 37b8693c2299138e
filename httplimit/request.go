package httplimit

import (
	"net/http"
	"net/netip"
	"net/url"

	"github.com/driplimit/drip/internal/door/frontdoor"
	"github.com/driplimit/drip/rules"
)

// reqValues reads a request's values, each at most once: the client IP,
// headers and verified claims as every front door does (frontdoor), and
// the query, path, method and cookies of HTTP.
type reqValues struct {
	frontdoor.Base
	r *http.Request

	queryDone bool
	query     url.Values

	// path is the path as rules read it (rules.Set.CleanPath), set by
	// Decide when a rule reads it.
	path string
}

func newReqValues(s *frontdoor.Snapshot, r *http.Request) *reqValues {
	return &reqValues{Base: frontdoor.Base{S: s, Peer: r.RemoteAddr, Header: r.Header}, r: r}
}

func (v *reqValues) Value(src rules.Source) (string, bool) {
	switch src.Kind {
	case rules.KindQuery:
		if !v.queryDone {
			v.query, v.queryDone = v.r.URL.Query(), true
		}
		return frontdoor.Joined(v.query[src.Name])
	case rules.KindPath:
		return v.path, true
	case rules.KindMethod:
		return rules.CleanMethod(v.r.Method), true
	case rules.KindBound:
		return v.bound(src) // llm.go
	case rules.KindCookie:
		var vals []string
		for _, c := range v.r.CookiesNamed(src.Name) {
			vals = append(vals, c.Value)
		}
		return frontdoor.Joined(vals)
	}
	return v.Base.Value(src)
}

// escapedPath is u's path as it was sent, percent-encoded: its RawPath
// when that is u's Path encoded (even in a way EscapedPath would not
// keep, so that an encoded slash stays one), else EscapedPath.
func escapedPath(u *url.URL) string {
	if u.RawPath != "" {
		if p, err := url.PathUnescape(u.RawPath); err == nil && p == u.Path {
			return u.RawPath
		}
	}
	return u.EscapedPath()
}

// ClientIP returns the address of the client that sent r. It is the peer
// address (r.RemoteAddr), unless that peer is a trusted proxy. Then
// X-Forwarded-For is read from right to left, skipping trusted hops; the
// first address not trusted is the client. If every hop is trusted, the
// leftmost is. If an entry cannot be parsed, the last good one before it
// is. With no trusted proxies the header is never read. ok is false when
// the peer address is not an IP (a Unix socket).
func ClientIP(r *http.Request, trusted []netip.Prefix) (netip.Addr, bool) {
	return frontdoor.ClientIP(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), trusted)
}

// FromTrustedProxy reports whether r's peer (r.RemoteAddr) is one of the
// trusted proxies: whether its forwarding headers are believed.
func FromTrustedProxy(r *http.Request, trusted []netip.Prefix) bool {
	return frontdoor.FromTrustedProxy(r.RemoteAddr, trusted)
}

// KeyIP returns the key value of a client address. An IPv4 address is
// kept as is. An IPv6 address becomes its prefix of v6bits
// ("2001:db8:1:2::/64"): one client usually holds a whole /64.
func KeyIP(a netip.Addr, v6bits int) string { return frontdoor.KeyIP(a, v6bits) }
