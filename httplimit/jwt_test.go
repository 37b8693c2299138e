package httplimit_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/driplimit/drip/rules"
)

const hmacSecret = "a-test-secret-of-at-least-32-bytes!"

// tierRules gives an enterprise tier to verified tokens with plan
// "enterprise" and a free tier to everyone else.
const tierRules = `
	"trusted_proxies": ["127.0.0.1", "::1"],
	"rules": [
		{"name": "enterprise", "group": "plan", "limit_keys": ["header:x-api-key"],
		 "match": {"jwt:plan": "enterprise"}, "algorithm_config": {"rps": 100, "burst": 200}},
		{"name": "free", "group": "plan", "limit_keys": ["header:x-api-key"],
		 "algorithm_config": {"rate": 1, "period": "1m", "burst": 2}}]}`

// jwtEnv writes files and a rules file with the given "jwt" setting into
// a temporary directory, and serves the tier rules from it.
func jwtEnv(t *testing.T, jwtSetting string, files map[string][]byte) *env {
	t.Helper()
	dir := t.TempDir()
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "rules.json")
	os.WriteFile(path, []byte(`{"jwt": `+jwtSetting+`,`+tierRules), 0o600)
	set, err := rules.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, nil, set)
	e.clock.Set(time.Now()) // tokens carry real times
	return e
}

func claims(plan string, mods ...func(jwt.MapClaims)) jwt.MapClaims {
	c := jwt.MapClaims{"sub": "user-1", "plan": plan, "exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()}
	for _, m := range mods {
		m(c)
	}
	return c
}

func expired(c jwt.MapClaims)  { c["exp"] = time.Now().Add(-time.Minute).Unix() }
func notYet(c jwt.MapClaims)   { c["nbf"] = time.Now().Add(time.Hour).Unix() }
func wrongIss(c jwt.MapClaims) { c["iss"] = "https://evil.example" }

func sign(t *testing.T, m jwt.SigningMethod, key any, c jwt.MapClaims, kid string) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func unsigned(t *testing.T, c jwt.MapClaims) string {
	return sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, c, "")
}

// forge keeps a valid token's header and signature but swaps in other
// claims.
func forge(t *testing.T, valid string, c jwt.MapClaims) string {
	parts := strings.Split(valid, ".")
	b, _ := json.Marshal(c)
	parts[1] = base64.RawURLEncoding.EncodeToString(b)
	return strings.Join(parts, ".")
}

// tier sends a request with token and returns the rule that applied.
func (e *env) tier(token string) string {
	e.t.Helper()
	r := e.do("/", "X-Api-Key: key-"+strconv.Itoa(int(e.hits.Load())), "Authorization: Bearer "+token)
	name, _, _ := strings.Cut(strings.TrimPrefix(r.h.Get("RateLimit-Policy"), `"`), `"`)
	return name
}

type tokenCase struct {
	name  string
	token string
	want  string
}

func checkTiers(t *testing.T, e *env, cases []tokenCase) {
	t.Helper()
	for _, c := range cases {
		if got := e.tier(c.token); got != c.want {
			t.Errorf("%s: tier %q, want %q", c.name, got, c.want)
		}
	}
}

func pemFile(t *testing.T, pub any) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func TestJWTHMAC(t *testing.T) {
	e := jwtEnv(t, `{"hmac_secret_env": "DRIP_TEST_JWT_SECRET"}`, nil)
	good := sign(t, jwt.SigningMethodHS256, []byte(hmacSecret), claims("enterprise"), "")
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	checkTiers(t, e, []tokenCase{
		{"HS256", good, "enterprise"},
		{"HS512", sign(t, jwt.SigningMethodHS512, []byte(hmacSecret), claims("enterprise"), ""), "enterprise"},
		{"valid, plan free", sign(t, jwt.SigningMethodHS256, []byte(hmacSecret), claims("free"), ""), "free"},
		{"forged signature", sign(t, jwt.SigningMethodHS256, []byte("another-secret-of-at-least-32-bytes"), claims("enterprise"), ""), "free"},
		{"forged claims", forge(t, sign(t, jwt.SigningMethodHS256, []byte(hmacSecret), claims("free"), ""), claims("enterprise")), "free"},
		{"alg none", unsigned(t, claims("enterprise")), "free"},
		{"RS256 when only HMAC is configured", sign(t, jwt.SigningMethodRS256, rk, claims("enterprise"), ""), "free"},
		{"expired", sign(t, jwt.SigningMethodHS256, []byte(hmacSecret), claims("enterprise", expired), ""), "free"},
		{"not yet valid", sign(t, jwt.SigningMethodHS256, []byte(hmacSecret), claims("enterprise", notYet), ""), "free"},
		{"no expiry", sign(t, jwt.SigningMethodHS256, []byte(hmacSecret), claims("enterprise", func(c jwt.MapClaims) { delete(c, "exp") }), ""), "free"},
		{"HS256 with an empty key", sign(t, jwt.SigningMethodHS256, []byte{}, claims("enterprise"), ""), "free"},
		{"garbage", "not.a.token", "free"},
		{"no token", "", "free"},
	})
	// Basic auth is not a bearer token.
	r := e.do("/", "X-Api-Key: k", "Authorization: Basic "+good)
	if !strings.HasPrefix(r.h.Get("RateLimit-Policy"), `"free"`) {
		t.Errorf("basic auth: %v", r.h)
	}
}

func TestJWTPublicKeys(t *testing.T) {
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	ek, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, dk, _ := ed25519.GenerateKey(rand.Reader)
	otherRSA, _ := rsa.GenerateKey(rand.Reader, 2048)
	otherEC, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	rsaPEM := pemFile(t, &rk.PublicKey)
	e := jwtEnv(t, `{"public_key_files": ["rsa.pem", "ec.pem", "ed.pem"], "issuer": "https://issuer.example"}`,
		map[string][]byte{"rsa.pem": rsaPEM, "ec.pem": pemFile(t, &ek.PublicKey), "ed.pem": pemFile(t, dk.Public())})
	iss := func(c jwt.MapClaims) { c["iss"] = "https://issuer.example" }
	checkTiers(t, e, []tokenCase{
		{"RS256", sign(t, jwt.SigningMethodRS256, rk, claims("enterprise", iss), ""), "enterprise"},
		{"PS384", sign(t, jwt.SigningMethodPS384, rk, claims("enterprise", iss), ""), "enterprise"},
		{"ES256", sign(t, jwt.SigningMethodES256, ek, claims("enterprise", iss), ""), "enterprise"},
		{"EdDSA", sign(t, jwt.SigningMethodEdDSA, dk, claims("enterprise", iss), ""), "enterprise"},
		{"RS256 by another key", sign(t, jwt.SigningMethodRS256, otherRSA, claims("enterprise", iss), ""), "free"},
		{"ES256 by another key", sign(t, jwt.SigningMethodES256, otherEC, claims("enterprise", iss), ""), "free"},
		{"ES384 by an unknown P-384 key", sign(t, jwt.SigningMethodES384, p384, claims("enterprise", iss), ""), "free"},
		// Algorithm confusion: an HMAC token keyed with the public key's bytes.
		{"HS256 keyed by the public key", sign(t, jwt.SigningMethodHS256, rsaPEM, claims("enterprise", iss), ""), "free"},
		{"HS256 with an empty key", sign(t, jwt.SigningMethodHS256, []byte{}, claims("enterprise", iss), ""), "free"},
		{"alg none", unsigned(t, claims("enterprise", iss)), "free"},
		{"wrong issuer", sign(t, jwt.SigningMethodRS256, rk, claims("enterprise", wrongIss), ""), "free"},
		{"expired", sign(t, jwt.SigningMethodES256, ek, claims("enterprise", iss, expired), ""), "free"},
	})
}

func TestJWTJWKS(t *testing.T) {
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	ek, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	otherRSA, _ := rsa.GenerateKey(rand.Reader, 2048)
	enc := base64.RawURLEncoding.EncodeToString
	eb, _ := ek.PublicKey.Bytes()
	set, _ := json.Marshal(map[string]any{"keys": []any{
		map[string]any{"kty": "RSA", "kid": "rsa-1", "alg": "RS256", "use": "sig", "n": enc(rk.N.Bytes()), "e": enc(big.NewInt(int64(rk.E)).Bytes())},
		map[string]any{"kty": "EC", "kid": "ec-1", "crv": "P-384", "x": enc(eb[1:49]), "y": enc(eb[49:])},
	}})
	e := jwtEnv(t, `{"jwks_file": "jwks.json", "audience": "api"}`, map[string][]byte{"jwks.json": set})
	aud := func(c jwt.MapClaims) { c["aud"] = "api" }
	checkTiers(t, e, []tokenCase{
		{"RS256 kid rsa-1", sign(t, jwt.SigningMethodRS256, rk, claims("enterprise", aud), "rsa-1"), "enterprise"},
		{"ES384 kid ec-1", sign(t, jwt.SigningMethodES384, ek, claims("enterprise", aud), "ec-1"), "enterprise"},
		{"ES384 without kid", sign(t, jwt.SigningMethodES384, ek, claims("enterprise", aud), ""), "enterprise"},
		// The JWKS pins rsa-1 to RS256.
		{"PS256 by rsa-1", sign(t, jwt.SigningMethodPS256, rk, claims("enterprise", aud), "rsa-1"), "free"},
		{"unknown key claiming kid rsa-1", sign(t, jwt.SigningMethodRS256, otherRSA, claims("enterprise", aud), "rsa-1"), "free"},
		{"wrong audience", sign(t, jwt.SigningMethodRS256, rk, claims("enterprise"), "rsa-1"), "free"},
		{"alg none", unsigned(t, claims("enterprise", aud)), "free"},
	})
}

func TestJWTVerifyFalse(t *testing.T) {
	e := jwtEnv(t, `{"verify": false}`, nil)
	checkTiers(t, e, []tokenCase{
		{"unsigned", unsigned(t, claims("enterprise")), "enterprise"},
		{"any signature", sign(t, jwt.SigningMethodHS256, []byte("whatever-secret-whatever-secret!"), claims("enterprise"), ""), "enterprise"},
		{"expired", unsigned(t, claims("enterprise", expired)), "free"},
		{"not a JWT", "abc", "free"},
	})
}

// The Retry-After jitter follows the verified subject, not the IP.
func TestJWTIdentity(t *testing.T) {
	e := jwtEnv(t, `{"hmac_secret_env": "DRIP_TEST_JWT_SECRET"}`, nil)
	for _, sub := range []string{"alice", "bob", "carol"} {
		tok := sign(t, jwt.SigningMethodHS256, []byte(hmacSecret), claims("free", func(c jwt.MapClaims) { c["sub"] = sub }), "")
		var r resp
		for range 3 {
			r = e.do("/", "X-Api-Key: "+sub, "Authorization: Bearer "+tok)
		}
		want := (rules.Jitter{Fraction: 0.5, Max: math.MaxInt64}).Seconds("sub:"+sub, time.Minute)
		if r.code != 429 || r.h.Get("Retry-After") != strconv.FormatInt(want, 10) {
			t.Errorf("%s: %d Retry-After %q, want %d", sub, r.code, r.h.Get("Retry-After"), want)
		}
	}
}

// A token's signature check is cached, but its expiry is checked at every
// use, and a forged token stays forged however often it is sent.
func TestJWTCacheKeepsExpiry(t *testing.T) {
	e := jwtEnv(t, `{"hmac_secret_env": "DRIP_TEST_JWT_SECRET"}`, nil)
	good := sign(t, jwt.SigningMethodHS256, []byte(hmacSecret), claims("enterprise"), "")
	forged := forge(t, good, claims("enterprise", func(c jwt.MapClaims) { c["sub"] = "mallory" }))
	soon := sign(t, jwt.SigningMethodHS256, []byte(hmacSecret), claims("enterprise", notYet, func(c jwt.MapClaims) {
		c["exp"] = time.Now().Add(3 * time.Hour).Unix()
	}), "")
	for range 3 {
		checkTiers(t, e, []tokenCase{{"good", good, "enterprise"}, {"forged", forged, "free"}, {"not yet", soon, "free"}})
	}
	e.clock.Add(90 * time.Minute) // past exp of good, past nbf of soon
	checkTiers(t, e, []tokenCase{{"good, expired", good, "free"}, {"forged", forged, "free"}, {"now valid", soon, "enterprise"}})
}
