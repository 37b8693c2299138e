package httplimit

import (
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strings"

	"github.com/golang-jwt/jwt/v5"

	"github.com/driplimit/drip/rules"
)

// reqValues reads a request's values, each at most once.
type reqValues struct {
	r *http.Request
	s *snapshot

	ipDone bool
	ip     netip.Addr
	ipOK   bool

	queryDone bool
	query     url.Values

	claimsDone bool
	claims     jwt.MapClaims

	pathDone bool
	path     string
}

func (v *reqValues) Value(src rules.Source) (string, bool) {
	switch src.Kind {
	case rules.KindIP:
		a, ok := v.clientIP()
		if !ok {
			return "", false
		}
		return KeyIP(a, v.s.rules.Set.IPv6Prefix), true
	case rules.KindHeader:
		return joined(v.r.Header[src.Name])
	case rules.KindQuery:
		if !v.queryDone {
			v.query, v.queryDone = v.r.URL.Query(), true
		}
		return joined(v.query[src.Name])
	case rules.KindJWT:
		x, ok := v.jwtClaims()[src.Name]
		if !ok {
			return "", false
		}
		return claimText(x)
	case rules.KindPath:
		return v.cleanPath(), true
	case rules.KindMethod:
		return v.r.Method, true
	case rules.KindCookie:
		var vals []string
		for _, c := range v.r.CookiesNamed(src.Name) {
			vals = append(vals, c.Value)
		}
		return joined(vals)
	case rules.KindGlobal:
		return "", true
	}
	return "", false
}

// joined is the value of a header, query parameter or cookie that a
// request may repeat: all of its values, joined with ", " (as HTTP joins
// repeated header lines), so that a request with two x-api-key headers is
// keyed on both, never on the one drip happened to read first (the
// upstream might believe the other); and a cost read from two values is
// not a number, so default_cost applies.
func joined(vals []string) (string, bool) {
	switch len(vals) {
	case 0:
		return "", false
	case 1:
		return vals[0], true
	}
	return strings.Join(vals, ", "), true
}

func (v *reqValues) clientIP() (netip.Addr, bool) {
	if !v.ipDone {
		v.ip, v.ipOK = ClientIP(v.r, v.s.rules.Set.TrustedProxies)
		v.ipDone = true
	}
	return v.ip, v.ipOK
}

func (v *reqValues) jwtClaims() jwt.MapClaims {
	if !v.claimsDone {
		v.claimsDone = true
		if v.s.jwt != nil {
			v.claims = v.s.jwt.claims(v.r)
		}
	}
	return v.claims
}

// cleanPath is the URL path as the upstream will route it: "/a/../b" is
// "/b", so that a match on "/api/*" cannot be dodged; a trailing slash is
// kept.
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
			if strings.HasSuffix(p, "/") && v.path != "/" {
				v.path += "/"
			}
		}
		v.pathDone = true
	}
	return v.path
}

// Identity is the client identity that seeds the Retry-After jitter:
// "sub:" and the verified JWT subject, else "ip:" and the client IP (its
// /64 for IPv6), else "key:" and the denying rule's key.
func (v *reqValues) Identity(key string) string {
	if v.s.jwt != nil {
		if sub, ok := v.jwtClaims()["sub"].(string); ok && sub != "" {
			return "sub:" + sub
		}
	}
	if a, ok := v.clientIP(); ok {
		return "ip:" + KeyIP(a, v.s.rules.Set.IPv6Prefix)
	}
	return "key:" + key
}
