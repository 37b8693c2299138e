package server

import (
	"net/http/httputil"
	"net/netip"
	"strings"

	"github.com/driplimit/drip/httplimit"
)

// forwardHeaders tells the upstream who the client is, as the gateway
// found it (httplimit.ClientIP under the rules' trusted_proxies):
//
//   - X-Forwarded-For: when the peer is a trusted proxy, the chain it sent
//     (every X-Forwarded-For line, joined) with the peer appended, as each
//     proxy of a chain does; otherwise the peer alone. A client's own
//     X-Forwarded-For is never passed on, so the upstream cannot be lied to
//     through drip.
//   - X-Forwarded-Host and X-Forwarded-Proto: a trusted peer's, else the
//     request's own Host and scheme. A trusted peer's X-Forwarded-Proto
//     that is not a URI scheme is dropped, from Forwarded too.
//   - Forwarded (RFC 7239): the same chain as X-Forwarded-For, one element
//     per address ("for=unknown" for an entry that is not one), the last
//     with the host and the scheme. Any Forwarded the request carried is
//     dropped: drip does not read it, so it cannot vouch for it.
//   - X-Real-IP: the client address drip keyed on (an IPv6 client's full
//     address, where the key is its prefix); dropped when the peer is not
//     an IP address.
func forwardHeaders(pr *httputil.ProxyRequest, trusted []netip.Prefix) {
	in, out := pr.In, pr.Out.Header
	trust := httplimit.FromTrustedProxy(in, trusted)
	if xff := in.Header.Values("X-Forwarded-For"); trust && len(xff) > 0 {
		out.Set("X-Forwarded-For", strings.Join(xff, ", "))
	}
	pr.SetXForwarded() // appends the peer; sets X-Forwarded-Host and -Proto
	if trust {
		if v := in.Header.Get("X-Forwarded-Host"); v != "" {
			out.Set("X-Forwarded-Host", v)
		}
		if v := in.Header.Get("X-Forwarded-Proto"); v != "" {
			out.Set("X-Forwarded-Proto", v)
		}
	}
	proto := out.Get("X-Forwarded-Proto")
	if !isScheme(proto) {
		// Not a URI scheme ("http;for=6.6.6.6, for=5.5.5.5" would add
		// elements to Forwarded): passed on neither way.
		out.Del("X-Forwarded-Proto")
		proto = ""
	}

	out.Del("X-Real-IP")
	if client, ok := httplimit.ClientIP(in, trusted); ok {
		out.Set("X-Real-IP", client.String())
	}

	var fwd []string
	for _, e := range strings.Split(out.Get("X-Forwarded-For"), ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		a, err := netip.ParseAddr(e)
		switch {
		case err != nil:
			fwd = append(fwd, "for=unknown")
		case a.Is4():
			fwd = append(fwd, "for="+a.String())
		default:
			fwd = append(fwd, `for="[`+a.String()+`]"`)
		}
	}
	out.Del("Forwarded")
	if len(fwd) > 0 {
		fwd[len(fwd)-1] += `;host="` + strings.NewReplacer(`"`, ``, `\`, ``).Replace(out.Get("X-Forwarded-Host")) + `"`
		if proto != "" {
			fwd[len(fwd)-1] += ";proto=" + proto
		}
		out.Set("Forwarded", strings.Join(fwd, ", "))
	}
}

// isScheme reports whether s is a URI scheme: a letter, then letters,
// digits, '+', '-' and '.'.
func isScheme(s string) bool {
	for i, c := range []byte(s) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}
