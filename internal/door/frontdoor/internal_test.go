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
// claims would take over 30 MB for 256 tokens (held in the token cache,
// the heap grew by 31 MB), where the heap may grow by 8 MB at most. 256
// tokens are enough to tell, and each costs about 9 ms of CPU to parse
// under the race detector (1024 took 94 s of a loaded machine).
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
	const tokens = 256
	for i := range tokens {
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
	after := heap()
	t.Logf("the live heap grew by %d KB after %d minted tokens", (int64(after)-int64(before))>>10, tokens)
	if after > before+8<<20 {
		t.Errorf("the live heap grew by %d MB after %d minted tokens", (after-before)>>20, tokens)
	}
	runtime.KeepAlive(v) // the verifier lives as long as its rules
}
