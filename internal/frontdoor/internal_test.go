package frontdoor

import (
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

func TestTokenCacheBounded(t *testing.T) {
	var c tokenCache
	for i := range 3 * tokenCacheSize {
		var h [32]byte
		h[0], h[1] = byte(i), byte(i>>8)
		c.put(h, jwt.MapClaims{})
	}
	if n := len(c.m); n > tokenCacheSize || n < tokenCacheSize/2 {
		t.Errorf("%d entries", n)
	}
}

func TestClaimText(t *testing.T) {
	for v, want := range map[any]string{"x": "x", true: "true", 2.5: "2.5"} {
		if got, ok := claimText(v); !ok || got != want {
			t.Errorf("claimText(%v) = %q", v, got)
		}
	}
	if _, ok := claimText([]any{"a"}); ok {
		t.Error("a list has a text")
	}
}
