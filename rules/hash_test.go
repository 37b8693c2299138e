package rules

import (
	"strings"
	"testing"
)

// TestHashedKeys: a hashed limit key keys by an HMAC of the value under
// the file's secret: never the value, the same key whether it comes from
// a request (Values) or by hand (KeyFrom), another under another secret.
func TestHashedKeys(t *testing.T) {
	const file = `{"key_secret_env": "S", "rules": [{"name": "r", "limit_keys": ["hash:api_key", "header:x-org"],
	  "algorithm_config": {"rps": 5}}]}`
	load := func(secret string) *Rule {
		set, err := ParseEnv([]byte(file), "f.json", Env{Getenv: func(string) string { return secret }})
		if err != nil {
			t.Fatal(err)
		}
		r, _ := set.Rule("r")
		return r
	}
	r := load(strings.Repeat("a", 32))
	vals, ok := r.KeyValues(func(s Source) (string, bool) {
		if s.Kind == KindAPIKey {
			return "sk-secret-key", true
		}
		return "org1", true
	})
	if !ok {
		t.Fatal("no values")
	}
	key := r.Key(vals)
	if strings.Contains(key, "sk-secret-key") || !strings.Contains(key, "org1") {
		t.Errorf("key %q", key)
	}
	byHand, err := r.KeyFrom(map[string]string{"hash:api_key": "sk-secret-key", "header:x-org": "org1"})
	if err != nil || byHand != key {
		t.Errorf("KeyFrom: %q %v, want %q", byHand, err, key)
	}
	if other := load(strings.Repeat("b", 32)); other.Key([]string{other.HashValue("sk-secret-key"), "org1"}) == key {
		t.Error("the same key under another secret")
	}
	if _, err := ParseEnv([]byte(file), "f.json", Env{Getenv: func(string) string { return "short" }}); err == nil || !strings.Contains(err.Error(), "hashed keys need at least 32") {
		t.Errorf("a short secret: %v", err)
	}
}
