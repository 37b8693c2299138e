package frontdoor

import (
	"net/netip"
	"strings"

	"github.com/golang-jwt/jwt/v5"

	"github.com/driplimit/drip/rules"
)

// Base is the part of an engine.Values that every front door reads the
// same way. Front doors embed it, answer the sources of their own kind (path, method, query,
// cookie) and pass the rest to Value.
type Base struct {
	S *Snapshot
	// Peer is the address the request came from ("ip:port").
	Peer string
	// Header holds the request's header fields: an http.Header (canonical
	// names), or gRPC metadata (lower-case names) with Lower set.
	Header map[string][]string
	Lower  bool

	ipDone bool
	ip     netip.Addr
	ipOK   bool

	claimsDone bool
	claims     jwt.MapClaims
}

// header returns the values of the header whose canonical name is name.
func (v *Base) header(name string) []string {
	if v.Lower {
		return v.Header[strings.ToLower(name)]
	}
	return v.Header[name]
}

// Value returns the request's value for the sources every front door has
// (ip, header, jwt, global); ok is false for others.
func (v *Base) Value(src rules.Source) (string, bool) {
	switch src.Kind {
	case rules.KindIP:
		a, ok := v.ClientIP()
		if !ok {
			return "", false
		}
		return KeyIP(a, v.S.Rules.Set.IPv6Prefix), true
	case rules.KindHeader:
		return Joined(v.header(src.Name))
	case rules.KindJWT:
		x, ok := v.Claims()[src.Name]
		if !ok {
			return "", false
		}
		return claimText(x)
	case rules.KindGlobal:
		return "", true
	case rules.KindAPIKey:
		return v.apiKey()
	}
	return "", false
}

// apiKey is the API key a client of OpenAI's or Anthropic's API sends:
// the token of "Authorization: Bearer <key>" (the scheme in any case),
// else the x-api-key header; a header sent twice is no key.
func (v *Base) apiKey() (string, bool) {
	if a := v.header("Authorization"); len(a) == 1 {
		if scheme, tok, ok := strings.Cut(a[0], " "); ok && strings.EqualFold(scheme, "Bearer") {
			if tok = strings.TrimSpace(tok); tok != "" {
				return tok, true
			}
		}
	}
	if k := v.header("X-Api-Key"); len(k) == 1 && k[0] != "" {
		return k[0], true
	}
	return "", false
}

// Joined is the value of a header, query parameter or cookie that a
// request may repeat: all of its values, joined with ", " (as HTTP joins
// repeated header lines), so that a request with two x-api-key headers is
// keyed on both, never on the one drip happened to read first (the
// upstream might believe the other); and a cost read from two values is
// not a number, so default_cost applies.
func Joined(vals []string) (string, bool) {
	switch len(vals) {
	case 0:
		return "", false
	case 1:
		return vals[0], true
	}
	return strings.Join(vals, ", "), true
}

// ClientIP is the request's client address under the rules' trusted
// proxies (the package's ClientIP).
func (v *Base) ClientIP() (netip.Addr, bool) {
	if !v.ipDone {
		v.ip, v.ipOK = ClientIP(v.Peer, v.header("X-Forwarded-For"), v.S.Rules.Set.TrustedProxies)
		v.ipDone = true
	}
	return v.ip, v.ipOK
}

// Claims returns the verified claims of the request's bearer token, or
// nil (no token, one that fails, or no jwt setting).
func (v *Base) Claims() jwt.MapClaims {
	if !v.claimsDone {
		v.claimsDone = true
		if v.S.jwt != nil {
			v.claims = v.S.jwt.claims(v.header("Authorization"))
		}
	}
	return v.claims
}

// Identity is the client identity that seeds the Retry-After jitter:
// "sub:" and the verified JWT subject, else "ip:" and the client IP (its
// /64 for IPv6), else "key:" and the denying rule's key.
func (v *Base) Identity(key string) string {
	if v.S.jwt != nil {
		if sub, ok := v.Claims()["sub"].(string); ok && sub != "" {
			return "sub:" + sub
		}
	}
	if a, ok := v.ClientIP(); ok {
		return "ip:" + KeyIP(a, v.S.Rules.Set.IPv6Prefix)
	}
	return "key:" + key
}

// Cost is 0, false: a program's cost function is the key-function
// middleware's (httplimit.KeyLimiter).
func (v *Base) Cost(*rules.Rule) (float64, bool) { return 0, false }
