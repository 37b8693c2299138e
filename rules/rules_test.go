package rules

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store"
)

const testSecret = "0123456789abcdef0123456789abcdef"

func TestTiersJSONAndYAMLAgree(t *testing.T) {
	t.Setenv("DRIP_TEST_JWT_SECRET", testSecret)
	j, err := Load("testdata/good/tiers.json")
	if err != nil {
		t.Fatal(err)
	}
	y, err := Load("testdata/good/tiers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(j.Rules, y.Rules) || !reflect.DeepEqual(j.JWT, y.JWT) {
		t.Fatalf("JSON and YAML differ:\n%+v\n%+v", j.Rules, y.Rules)
	}
	if string(j.JWT.HMACSecret) != testSecret || !j.JWT.Verify {
		t.Errorf("jwt = %+v", j.JWT)
	}
	want := []Rule{
		{Name: "enterprise", Group: "plan", LimitKeys: []Source{{Kind: KindHeader, Name: "X-Api-Key"}},
			Match: []Condition{{Source: Source{Kind: KindJWT, Name: "plan"}, Values: []string{"enterprise"}}},
			Mode:  Enforce, Limit: drip.Limit{Algorithm: drip.TokenBucket, Rate: 1000, Period: time.Second, Burst: 2000},
			CostSource: Source{Kind: KindFixed}, FixedCost: 1, DefaultCost: 1, OnError: Allow, LocalShare: 0.5, Index: 0},
		{Name: "free", Group: "plan", LimitKeys: []Source{{Kind: KindHeader, Name: "X-Api-Key"}},
			Mode: Enforce, Limit: drip.Limit{Algorithm: drip.TokenBucket, Rate: 10, Period: time.Second, Burst: 20},
			CostSource: Source{Kind: KindFixed}, FixedCost: 1, DefaultCost: 1, OnError: Allow, LocalShare: 0.5, Index: 1},
		{Name: "per-ip", LimitKeys: []Source{{Kind: KindIP}}, Mode: Shadow,
			Limit:      drip.Limit{Algorithm: drip.TokenBucket, Rate: 5, Period: time.Second, Burst: 10},
			CostSource: Source{Kind: KindHeader, Name: "X-Request-Weight"}, FixedCost: 1, DefaultCost: 1, OnError: Allow, LocalShare: 0.5, Index: 2},
	}
	if !reflect.DeepEqual(j.Rules, want) {
		t.Errorf("rules:\n%+v\nwant\n%+v", j.Rules, want)
	}
	if r, ok := j.Rule("free"); !ok || r.Name != "free" {
		t.Errorf("Rule(free) = %v, %v", r, ok)
	}
	if _, ok := j.Rule("nope"); ok {
		t.Error("Rule(nope) found")
	}
	if !j.UsesJWT() {
		t.Error("UsesJWT false")
	}
}

func TestEverything(t *testing.T) {
	s, err := Load("testdata/good/everything.yaml")
	if err != nil {
		t.Fatal(err)
	}
	wantProxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.1/32"), netip.MustParsePrefix("fd00::/8")}
	if !reflect.DeepEqual(s.TrustedProxies, wantProxies) {
		t.Errorf("proxies %v", s.TrustedProxies)
	}
	if s.IPv6Prefix != 56 || s.OnError != Local || s.LocalShare != 0.25 || s.StoreTimeout != 20*time.Millisecond ||
		s.Breaker != (Breaker{Failures: 3, FailureRatio: 0.75, Stall: 300 * time.Millisecond, Cooldown: 2 * time.Second}) || !s.ExactPaths {
		t.Errorf("globals %+v", s)
	}
	if s.JWT == nil || len(s.JWT.Keys) != 2 || s.JWT.Issuer != "https://issuer.example" || s.JWT.Audience != "api" || s.JWT.Leeway != 5*time.Second {
		t.Errorf("jwt %+v", s.JWT)
	}
	if _, ok := s.JWT.Keys[0].Key.(*rsa.PublicKey); !ok {
		t.Errorf("key 0 is %T", s.JWT.Keys[0].Key)
	}
	if _, ok := s.JWT.Keys[1].Key.(*ecdsa.PublicKey); !ok {
		t.Errorf("key 1 is %T", s.JWT.Keys[1].Key)
	}
	search, _ := s.Rule("search")
	if search.OnError != Deny || search.Limit.Algorithm != drip.FixedWindow || search.Limit.Start != time.Minute ||
		search.Limit.Rate != 600 || search.Limit.Period != time.Minute || search.CostSource != (Source{Kind: KindQuery, Name: "pages"}) || search.DefaultCost != 2 {
		t.Errorf("search %+v", search)
	}
	wantMatch := []Condition{
		{Source: Source{Kind: KindPath}, Values: []string{"/search"}, Prefixes: []string{"/api/search/"}},
		{Source: Source{Kind: KindMethod}, Values: []string{"GET"}},
		{Source: Source{Kind: KindJWT, Name: "admin"}, Values: []string{"false"}},
	}
	if !reflect.DeepEqual(search.Match, wantMatch) {
		t.Errorf("match %+v", search.Match)
	}
	burst, _ := s.Rule("search-burst")
	if burst.Group != "search" || burst.OnError != Deny || !reflect.DeepEqual(burst.Match, search.Match) || burst.Limit != search.Limit {
		t.Errorf("merged rule %+v", burst)
	}
	up, _ := s.Rule("uploads")
	if up.OnError != Local || up.LocalShare != 1 || up.FixedCost != 0.5 || up.Limit.Refill != drip.Interval ||
		!reflect.DeepEqual(up.LimitKeys, []Source{{Kind: KindCookie, Name: "session"}, {Kind: KindHeader, Name: "X-Tenant"}}) {
		t.Errorf("uploads %+v", up)
	}
	every, _ := s.Rule("everyone")
	if every.OnError != Allow || every.Limit.Burst != 100000 || every.LocalShare != 0.25 {
		t.Errorf("everyone %+v", every)
	}
}

func TestDefault(t *testing.T) {
	s := Default()
	if len(s.Rules) != 2 || s.Rules[0].Name != "per-ip" || s.Rules[0].Mode != Enforce || s.Rules[0].Limit.Rate != 10 ||
		s.Rules[0].Limit.Burst != 20 || s.Rules[1].Mode != Shadow || s.OnError != Allow || len(s.TrustedProxies) != 0 {
		t.Fatalf("default %+v", s.Rules)
	}
}

func TestFormatSniffing(t *testing.T) {
	yaml := "rules:\n  - {name: a, limit_keys: [global], algorithm_config: {rps: 1}}\n"
	json := `{"rules": [{"name": "a", "limit_keys": ["global"], "algorithm_config": {"rps": 1}}]}`
	for _, c := range []struct{ data, name string }{{yaml, "rules"}, {json, "rules"}, {json, "rules.yaml"}, {yaml, "x.yml"}, {"  \n" + json, ""}} {
		if _, err := Parse([]byte(c.data), c.name); err != nil {
			t.Errorf("Parse(%q): %v", c.name, err)
		}
	}
	if _, err := Parse([]byte(yaml), "rules.json"); err == nil {
		t.Error("YAML named .json parsed")
	}
}

func TestErrorListsEveryProblem(t *testing.T) {
	_, err := Parse([]byte(`{"rules": [{"name": "a"}, {"name": "b", "limit_keys": ["x"], "algorithm_config": {"rps": 0}}], "x": 1}`), "f.json")
	var re *Error
	if !errors.As(err, &re) {
		t.Fatalf("err %v", err)
	}
	want := []Issue{
		{"rules[0].limit_keys", `required (use ["global"] for one bucket shared by every request)`, 1, ""},
		{"rules[0].algorithm_config", "required", 1, ""},
		{"rules[1].limit_keys[0]", `"x" is not a key source (` + sourceList + ")", 1, ""},
		{"rules[1].algorithm_config.rps", "must be > 0", 1, ""},
		{"x", "unknown field", 1, ""},
	}
	if !reflect.DeepEqual(re.Problems, want) {
		t.Errorf("problems:\n%q\nwant\n%q", re.Problems, want)
	}
	if !strings.HasPrefix(err.Error(), "f.json:1: rules[0].limit_keys: required") || strings.Count(err.Error(), "\n") != 4 {
		t.Errorf("Error() = %q", err.Error())
	}
}

func rule(keys ...string) *Rule {
	r := &Rule{Name: "r"}
	for _, k := range keys {
		s, err := ParseSource(k)
		if err != nil {
			panic(err)
		}
		r.LimitKeys = append(r.LimitKeys, s)
	}
	return r
}

func TestKeyCannotBeForged(t *testing.T) {
	r := rule("header:a", "header:b")
	keys := map[string][]string{}
	for _, vals := range [][]string{
		{"1|2", "3"}, {"1", "2|3"}, {`1\`, "2"}, {`1\|2`, "3"}, {"1", `\|2`}, {"", "1"}, {"1", ""},
		{strings.Repeat("x", 129), "1"}, {`\h` + strings.Repeat("0", 64), "1"},
	} {
		k := r.Key(vals)
		if prev, dup := keys[k]; dup {
			t.Errorf("%q and %q share the key %q", prev, vals, k)
		}
		keys[k] = vals
	}
	if got := r.Key([]string{"a|b", `c\d`}); got != `r|a\|b|c\\d` {
		t.Errorf("Key = %q", got)
	}
	long := r.Key([]string{strings.Repeat("x", 10000), "y"})
	if len(long) > 100 || !strings.HasPrefix(long, `r|\h`) {
		t.Errorf("long key %q", long)
	}
	g := rule("global")
	if g.Key(nil) != "r" {
		t.Errorf("global key %q", g.Key(nil))
	}
	mixed := rule("global", "method")
	if mixed.Key([]string{"GET"}) != "r|GET" {
		t.Errorf("mixed key %q", mixed.Key([]string{"GET"}))
	}
	// Another rule's name cannot be reached by a value: names have no '|'.
	other := &Rule{Name: "r|x", LimitKeys: r.LimitKeys}
	if _, err := Parse([]byte(`{"rules":[{"name":"r|x","limit_keys":["global"],"algorithm_config":{"rps":1}}]}`), "x.json"); err == nil {
		t.Errorf("a name with | was accepted (%s)", other.Name)
	}
}

func TestKeyFrom(t *testing.T) {
	r := rule("header:x-api-key", "ip:address", "global")
	k, err := r.KeyFrom(map[string]string{"header:X-API-KEY": "k1", "ip:address": "10.0.0.1"})
	if err != nil || k != r.Key([]string{"k1", "10.0.0.1"}) {
		t.Errorf("KeyFrom = %q, %v", k, err)
	}
	if _, err := r.KeyFrom(map[string]string{"header:x-api-key": "k1"}); err == nil || !strings.Contains(err.Error(), "ip:address") {
		t.Errorf("missing value: %v", err)
	}
	if _, err := r.KeyFrom(map[string]string{"header:x-api-key": "k1", "ip:address": "1", "method": "GET"}); err == nil {
		t.Error("extra value accepted")
	}
	if _, err := r.KeyFrom(map[string]string{"bogus": "1"}); err == nil {
		t.Error("bad source accepted")
	}
}

func TestMatchAndValues(t *testing.T) {
	s, err := Parse([]byte(`{"rules":[{"name":"r","limit_keys":["header:x-key","global"],
		"match":{"path":["/exact","/api/*"],"method":"POST"},"algorithm_config":{"rps":1}}]}`), "m.json")
	if err != nil {
		t.Fatal(err)
	}
	r := &s.Rules[0]
	get := func(m map[Source]string) func(Source) (string, bool) {
		return func(s Source) (string, bool) {
			if s.Kind == KindGlobal {
				return "", true
			}
			v, ok := m[s]
			return v, ok
		}
	}
	path, method, key := Source{Kind: KindPath}, Source{Kind: KindMethod}, Source{Kind: KindHeader, Name: "X-Key"}
	for _, c := range []struct {
		vals  map[Source]string
		match bool
	}{
		{map[Source]string{path: "/exact", method: "POST"}, true},
		{map[Source]string{path: "/api/", method: "POST"}, true},
		{map[Source]string{path: "/api/v1/x", method: "POST"}, true},
		{map[Source]string{path: "/api", method: "POST"}, false},
		{map[Source]string{path: "/exact/", method: "POST"}, false},
		{map[Source]string{path: "/exact", method: "GET"}, false},
		{map[Source]string{path: "/exact"}, false},
	} {
		if got := r.Matches(get(c.vals)); got != c.match {
			t.Errorf("Matches(%v) = %v", c.vals, got)
		}
	}
	if v, ok := r.KeyValues(get(map[Source]string{key: "k"})); !ok || !reflect.DeepEqual(v, []string{"k"}) {
		t.Errorf("Values = %v, %v", v, ok)
	}
	for _, m := range []map[Source]string{{}, {key: ""}} {
		if _, ok := r.KeyValues(get(m)); ok {
			t.Errorf("Values(%v) ok: a missing or empty key value must not limit", m)
		}
	}
}

func TestSourceRoundTrip(t *testing.T) {
	for _, s := range []string{"ip:address", "header:x-api-key", "query:key", "jwt:plan", "path", "method", "cookie:sid", "global"} {
		src, err := ParseSource(s)
		if err != nil || src.String() != s {
			t.Errorf("ParseSource(%q) = %v, %v", s, src, err)
		}
	}
	for _, s := range []string{"", "ip", "ip:port", "header:", "header:a b", "query:", "jwt: x", "path:x", "cookie:a;b", "body:x", "GLOBAL"} {
		if _, err := ParseSource(s); err == nil {
			t.Errorf("ParseSource(%q) accepted", s)
		}
	}
}

func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestPublicKeyFiles(t *testing.T) {
	dir := t.TempDir()
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	ek, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	epub, _, _ := ed25519.GenerateKey(rand.Reader)
	pkix1, _ := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	pkix2, _ := x509.MarshalPKIXPublicKey(&ek.PublicKey)
	pkix3, _ := x509.MarshalPKIXPublicKey(epub)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "t"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	cert, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ek.PublicKey, ek)
	if err != nil {
		t.Fatal(err)
	}
	files := []string{
		writePEM(t, dir, "rsa.pem", "PUBLIC KEY", pkix1),
		writePEM(t, dir, "rsa1.pem", "RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(&rk.PublicKey)),
		writePEM(t, dir, "ec.pem", "PUBLIC KEY", pkix2),
		writePEM(t, dir, "ed.pem", "PUBLIC KEY", pkix3),
		writePEM(t, dir, "cert.pem", "CERTIFICATE", cert),
	}
	f, _ := json.Marshal(map[string]any{"jwt": map[string]any{"public_key_files": files},
		"rules": []any{map[string]any{"name": "u", "limit_keys": []string{"jwt:sub"}, "algorithm_config": map[string]any{"rps": 1}}}})
	path := filepath.Join(dir, "rules.json")
	os.WriteFile(path, f, 0o600)
	s, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []any{&rk.PublicKey, &rk.PublicKey, &ek.PublicKey, epub, &ek.PublicKey}
	if len(s.JWT.Keys) != len(want) {
		t.Fatalf("%d keys", len(s.JWT.Keys))
	}
	for i, k := range s.JWT.Keys {
		type equaler interface{ Equal(crypto.PublicKey) bool }
		if !k.Key.(equaler).Equal(want[i]) {
			t.Errorf("key %d differs", i)
		}
	}
}

func TestJWKSFile(t *testing.T) {
	dir := t.TempDir()
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	ek, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	epub, _, _ := ed25519.GenerateKey(rand.Reader)
	enc := base64.RawURLEncoding.EncodeToString
	ecb, _ := ek.PublicKey.Bytes() // 0x04 || X || Y
	jwks := map[string]any{"keys": []any{
		map[string]any{"kty": "RSA", "kid": "r1", "alg": "RS256", "n": enc(rk.N.Bytes()), "e": enc(big.NewInt(int64(rk.E)).Bytes())},
		map[string]any{"kty": "EC", "kid": "e1", "crv": "P-256", "x": enc(ecb[1:33]), "y": enc(ecb[33:])},
		map[string]any{"kty": "OKP", "kid": "d1", "crv": "Ed25519", "x": enc(epub)},
		map[string]any{"kty": "RSA", "kid": "skip", "use": "enc", "n": "AQAB", "e": "AQAB"},
	}}
	b, _ := json.Marshal(jwks)
	os.WriteFile(filepath.Join(dir, "jwks.json"), b, 0o600)
	rules := "jwt: {jwks_file: jwks.json}\nrules: [{name: u, limit_keys: [jwt:sub], algorithm_config: {rps: 1}}]\n"
	os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(rules), 0o600)
	s, err := Load(filepath.Join(dir, "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.JWT.Keys) != 3 {
		t.Fatalf("%d keys", len(s.JWT.Keys))
	}
	if k := s.JWT.Keys[0]; k.ID != "r1" || k.Alg != "RS256" || !rk.PublicKey.Equal(k.Key) {
		t.Errorf("rsa %+v", k)
	}
	if k := s.JWT.Keys[1]; k.ID != "e1" || !ek.PublicKey.Equal(k.Key) {
		t.Errorf("ec %+v", k)
	}
	if k := s.JWT.Keys[2]; k.ID != "d1" || !epub.Equal(k.Key) {
		t.Errorf("ed %+v", k)
	}
}

// TestParseReadsNothing: Parse names a jwt section's secret and key files
// without reading them (no such variable or file needs to exist); the
// loader, ParseEnv, reads them from the environment it is given.
func TestParseReadsNothing(t *testing.T) {
	hmac := []byte(`{"jwt": {"hmac_secret_env": "DRIP_TEST_NO_SUCH_VAR"}, "rules": [{"name": "r", "limit_keys": ["jwt:sub"], "algorithm_config": {"rps": 1}}]}`)
	set, err := Parse(hmac, "dir/r.json")
	if err != nil || set.JWT.HMACSecretEnv != "DRIP_TEST_NO_SUCH_VAR" || set.JWT.HMACSecret != nil {
		t.Fatalf("Parse: %+v %v", set, err)
	}
	secret := strings.Repeat("s", 32)
	env := Env{
		Getenv:   func(n string) string { return map[string]string{"DRIP_TEST_NO_SUCH_VAR": secret}[n] },
		ReadFile: func(p string) ([]byte, error) { return nil, fmt.Errorf("read %s", p) },
	}
	if set, err := ParseEnv(hmac, "dir/r.json", env); err != nil || string(set.JWT.HMACSecret) != secret {
		t.Fatalf("ParseEnv: %+v %v", set, err)
	}
	keys := []byte(`{"jwt": {"public_key_files": ["k.pem"]}, "rules": [{"name": "r", "limit_keys": ["jwt:sub"], "algorithm_config": {"rps": 1}}]}`)
	set, err = Parse(keys, "dir/r.json")
	if err != nil || len(set.JWT.PublicKeyFiles) != 1 || set.JWT.PublicKeyFiles[0] != filepath.Join("dir", "k.pem") || set.JWT.Keys != nil {
		t.Fatalf("Parse: %+v %v", set, err)
	}
	if _, err := ParseEnv(keys, "dir/r.json", env); err == nil || !strings.Contains(err.Error(), "read "+filepath.Join("dir", "k.pem")) {
		t.Fatalf("ParseEnv with an unreadable key file: %v", err)
	}
}

func TestConcurrencyRule(t *testing.T) {
	set, err := Parse([]byte(`{"rules": [
		{"name": "slots", "limit_keys": ["ip:address"], "algorithm": "concurrency",
		 "algorithm_config": {"max_in_flight": 8, "lease_ttl": "45s"}},
		{"name": "default-ttl", "limit_keys": ["global"], "algorithm": "concurrency",
		 "algorithm_config": {"max_in_flight": 2}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := set.Rules[0].Limit, drip.InFlight(8, 45*time.Second); got != want {
		t.Errorf("limit %+v, want %+v", got, want)
	}
	if got, want := set.Rules[1].Limit, drip.InFlight(2, store.DefaultLeaseTTL); got != want {
		t.Errorf("limit %+v, want %+v", got, want)
	}
	if set.Rules[0].FixedCost != 1 {
		t.Errorf("cost %v, want 1 (a request holds one slot)", set.Rules[0].FixedCost)
	}
}

// TestConcurrencyOnError: a concurrency rule denies when the store fails
// unless the rule itself says otherwise; the file's on_error is for rate
// limits (a store hiccup must not let slots overflow by accident).
func TestConcurrencyOnError(t *testing.T) {
	s, err := Parse([]byte(`{"on_error": "allow", "rules": [
	  {"name": "c", "limit_keys": ["global"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 3}},
	  {"name": "c2", "limit_keys": ["global"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 3}, "on_error": "allow"},
	  {"name": "r", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1s"}}]}`), "c.json")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]OnError{"c": Deny, "c2": Allow, "r": Allow} {
		if r, _ := s.Rule(name); r.OnError != want {
			t.Errorf("%s: on_error %q, want %q", name, r.OnError, want)
		}
	}
}
