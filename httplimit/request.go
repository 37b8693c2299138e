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
		vals := v.r.Header[src.Name]
		if len(vals) == 0 {
			return "", false
		}
		return vals[0], true
	case rules.KindQuery:
		if !v.queryDone {
			v.query, v.queryDone = v.r.URL.Query(), true
		}
		vals := v.query[src.Name]
		if len(vals) == 0 {
			return "", false
		}
		return vals[0], true
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
		c, err := v.r.Cookie(src.Name)
		if err != nil {
			return "", false
		}
		return c.Value, true
	case rules.KindGlobal:
		return "", true
	}
	return "", false
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
