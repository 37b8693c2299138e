package frontdoor

import (
	"encoding/base64"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/driplimit/drip/rules"
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

// TestUnverifiedClaimsNotHeld: with "verify": false anyone can mint
// tokens, so a flood of distinct ones, each near the 16 KiB bound and
// packed with small claims (a map entry each), must not be held: their
// claims would have taken over 100 MB for 1024 tokens.
func TestUnverifiedClaimsNotHeld(t *testing.T) {
	v := newVerifier(&rules.JWT{Verify: false}, nil)
	head := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`))
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for i := range 1024 {
		var b strings.Builder
		fmt.Fprintf(&b, `{"exp":9999999999,"sub":"u%d"`, i)
		for j := 0; b.Len() < 11800; j++ {
			fmt.Fprintf(&b, `,"%x":0`, j)
		}
		b.WriteString("}")
		tok := head + "." + base64.RawURLEncoding.EncodeToString([]byte(b.String())) + "."
		if len(tok) > maxTokenLen {
			t.Fatalf("a token of %d bytes", len(tok))
		}
		// The claims are read all the same, at each use.
		if c := v.claims([]string{"Bearer " + tok}); c["sub"] != fmt.Sprintf("u%d", i) {
			t.Fatalf("token %d: claims sub %v", i, c["sub"])
		}
	}
	if after := heap(); after > before+32<<20 {
		t.Errorf("the live heap grew by %d MB after 1024 minted tokens", (after-before)>>20)
	}
	runtime.KeepAlive(v) // the verifier lives as long as its rules
}
