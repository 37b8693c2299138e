package frontdoor

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/driplimit/drip/rules"
)

// maxTokenLen bounds the bearer tokens that are parsed at all.
const maxTokenLen = 16 << 10

// verifier reads the claims of a request's bearer token, as a rules
// file's "jwt" setting says. A token that fails verification (signature,
// algorithm, exp, nbf, iss, aud) contributes no claims.
type verifier struct {
	cfg       *rules.JWT
	parser    *jwt.Parser
	validator *jwt.Validator // exp, nbf, iss, aud, at every use
	keys      jwt.Keyfunc
	cache     tokenCache
}

func newVerifier(cfg *rules.JWT, now func() time.Time) *verifier {
	if cfg == nil {
		return nil
	}
	opts := []jwt.ParserOption{jwt.WithJSONNumber(), jwt.WithLeeway(cfg.Leeway)}
	if now != nil {
		opts = append(opts, jwt.WithTimeFunc(now))
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	if cfg.Verify {
		// A verified token must carry an expiry: a stolen token must not
		// grant a tier for ever. (Unverified claims, "verify": false, are a
		// gateway's business.)
		opts = append(opts, jwt.WithExpirationRequired())
	}
	v := &verifier{cfg: cfg, validator: jwt.NewValidator(opts...)}
	if !cfg.Verify {
		v.parser = jwt.NewParser(opts...)
		return v
	}
	// Only the algorithms of the configured keys are accepted: never
	// "none", and never an HMAC token checked against a public key.
	// Non-nil even when empty: jwt.WithValidMethods(nil) would accept
	// every algorithm, while an empty list refuses them all.
	methods := []string{}
	if len(cfg.HMACSecret) > 0 {
		methods = append(methods, "HS256", "HS384", "HS512")
	}
	var hasRSA, hasEC, hasEd bool
	for _, k := range cfg.Keys {
		switch k.Key.(type) {
		case *rsa.PublicKey:
			hasRSA = true
		case *ecdsa.PublicKey:
			hasEC = true
		case ed25519.PublicKey:
			hasEd = true
		}
	}
	if hasRSA {
		methods = append(methods, "RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
	}
	if hasEC {
		methods = append(methods, "ES256", "ES384", "ES512")
	}
	if hasEd {
		methods = append(methods, "EdDSA")
	}
	v.parser = jwt.NewParser(append(opts, jwt.WithValidMethods(methods))...)
	v.keys = v.keyfunc
	return v
}

// keyfunc picks the keys that may have signed t: the HMAC secret, or the
// public keys of the algorithm's type, narrowed to the token's kid when a
// key has that id.
func (v *verifier) keyfunc(t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	if strings.HasPrefix(alg, "HS") {
		if len(v.cfg.HMACSecret) == 0 {
			return nil, errors.New("no HMAC secret configured")
		}
		return v.cfg.HMACSecret, nil
	}
	kid, _ := t.Header["kid"].(string)
	var set, byKid []jwt.VerificationKey
	for _, k := range v.cfg.Keys {
		if !keyFits(alg, k) {
			continue
		}
		set = append(set, k.Key)
		if kid != "" && k.ID == kid {
			byKid = append(byKid, k.Key)
		}
	}
	if len(byKid) > 0 {
		set = byKid
	}
	return jwt.VerificationKeySet{Keys: set}, nil
}

func keyFits(alg string, k rules.PublicKey) bool {
	if k.Alg != "" && k.Alg != alg {
		return false
	}
	switch k.Key.(type) {
	case *rsa.PublicKey:
		return strings.HasPrefix(alg, "RS") || strings.HasPrefix(alg, "PS")
	case *ecdsa.PublicKey:
		return strings.HasPrefix(alg, "ES")
	case ed25519.PublicKey:
		return alg == "EdDSA"
	}
	return false
}

// bearer returns the bearer token of a request's Authorization header
// (its values hs). A request with several Authorization headers has none:
// which one the upstream believes is not drip's to guess, so it keys on no
// claims rather than on one of them.
func bearer(hs []string) (string, bool) {
	if len(hs) != 1 {
		return "", false
	}
	h := hs[0]
	if len(h) < 7 || !strings.EqualFold(h[:7], "bearer ") {
		return "", false
	}
	t := strings.TrimSpace(h[7:])
	if t == "" || len(t) > maxTokenLen {
		return "", false
	}
	return t, true
}

// claims returns the verified claims of the bearer token in the
// Authorization header values hs, or nil.
//
// Checking a signature costs tens of microseconds (RSA, ECDSA), and a
// client sends the same token again and again, so the outcome of the
// signature check is cached per token (by its SHA-256), for the life of
// the rules snapshot: the claims of a token whose signature holds, or the
// fact that it does not. The claims (exp, nbf, iss, aud) are validated
// again at every use, so a cached token still expires on time.
//
// Unverified tokens ("verify": false) are parsed at each use and never
// cached: there is no signature check to save, and anyone can mint them,
// so a cache would hold the claims of thousands of 16 KiB tokens a client
// made up (hundreds of megabytes).
func (v *verifier) claims(hs []string) jwt.MapClaims {
	tok, ok := bearer(hs)
	if !ok {
		return nil
	}
	var claims jwt.MapClaims
	if v.cfg.Verify {
		h := sha256.Sum256([]byte(tok))
		var hit bool
		if claims, hit = v.cache.get(h); !hit {
			claims = v.parse(tok)
			v.cache.put(h, claims)
		}
	} else {
		claims = v.parse(tok)
	}
	if claims == nil || v.validator.Validate(claims) != nil {
		return nil
	}
	return claims
}

// parse checks tok's signature (unless verify is false) and returns its
// claims, or nil when the token is malformed or its signature fails.
// Claims are not validated here.
func (v *verifier) parse(tok string) jwt.MapClaims {
	claims := jwt.MapClaims{}
	if !v.cfg.Verify {
		if _, _, err := v.parser.ParseUnverified(tok, claims); err != nil {
			return nil
		}
		return claims
	}
	_, err := v.parser.ParseWithClaims(tok, claims, v.keys)
	if err != nil && !errors.Is(err, jwt.ErrTokenInvalidClaims) {
		return nil // the signature was checked before the claims: a claims error means it held
	}
	return claims
}

// tokenCacheSize bounds the tokens whose signature check is remembered.
const tokenCacheSize = 4096

// tokenCache remembers signature checks: claims, or nil for a failure.
type tokenCache struct {
	mu sync.Mutex
	m  map[[32]byte]jwt.MapClaims
}

func (c *tokenCache) get(h [32]byte) (jwt.MapClaims, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	claims, ok := c.m[h]
	return claims, ok
}

func (c *tokenCache) put(h [32]byte, claims jwt.MapClaims) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[[32]byte]jwt.MapClaims)
	}
	if len(c.m) >= tokenCacheSize {
		// Forget about half, at random (map order): cheap, and a flood of
		// distinct tokens cannot pin memory.
		n := 0
		for k := range c.m {
			delete(c.m, k)
			if n++; n >= tokenCacheSize/2 {
				break
			}
		}
	}
	c.m[h] = claims
}

// claimText is the text of a scalar claim (string, number, boolean);
// lists and objects have none.
func claimText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return string(x), true
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), true
	case bool:
		return strconv.FormatBool(x), true
	}
	return "", false
}
