package sfv

import (
	"strings"
	"testing"
)

func TestParseRejects(t *testing.T) {
	for _, bad := range []string{
		`"café";q=1`,             // non-ASCII in a string
		"\"a\tb\"",               // a control character
		`"a\n"`,                  // an escape other than \" and \\
		`"open`,                  // unterminated
		`"a";Q=1`,                // an uppercase key
		`"a";q=1.2345`,           // four fractional digits
		`"a";q=1.`,               // no fractional digit
		`"a";q=1234567890123.5`,  // 13 integer digits in a decimal
		`"a";q=1234567890123456`, // 16-digit integer
		`"a",`,                   // trailing comma
		`"a" "b"`,                // no comma
		`,"a"`,                   // leading comma
		`"a";q=?2`,               // bad boolean
		`"a";q=:YQ=`,             // unterminated bytes
	} {
		if _, err := ParseList(bad); err == nil {
			t.Errorf("ParseList(%q) accepted it", bad)
		}
	}
	for _, good := range []string{
		`"free";q=20;w=2`,
		`"free";r=7;t=2, "pro";r=0;t=30`,
		`"a\"b\\c";q=2.5;w=1`,
		` tok/en;a;b=?1;c=:YQ==:, (1 2);x=-3  `,
		`"x";q=999999999999.999`,
		``,
	} {
		if _, err := ParseList(good); err != nil {
			t.Errorf("ParseList(%q): %v", good, err)
		}
	}
	for _, bad := range []string{"", "1 2", "1.2345", "\"é\""} {
		if _, err := ParseItem(bad); err == nil {
			t.Errorf("ParseItem(%q) accepted it", bad)
		}
	}
}

func TestStringRoundTrip(t *testing.T) {
	for _, name := range []string{"free", "café", `we"ird\`, "50%", "tab\there", "日本", "", "a;q=1, b"} {
		s := String(name)
		it, err := ParseItem(s)
		if err != nil {
			t.Fatalf("String(%q) = %s: %v", name, s, err)
		}
		got, err := Unescape(it.Value.(string))
		if err != nil || got != name {
			t.Errorf("String(%q) = %s reads back as %q (%v)", name, s, got, err)
		}
	}
	if got := String("café"); got != `"caf%c3%a9"` {
		t.Errorf("String(café) = %s", got)
	}
	if got := String("free"); got != `"free"` {
		t.Errorf("String(free) = %s", got)
	}
}

func TestNumber(t *testing.T) {
	for x, want := range map[float64]string{20: "20", 2.5: "2.5", 0.3333333: "0.333", 0.0001: "0.0", 1e12: "1000000000000", 999999999999.9999: "999999999999.999", 1.9999: "1.999"} {
		got := Number(x)
		if got != want {
			t.Errorf("Number(%v) = %s, want %s", x, got, want)
		}
		if _, err := ParseItem(got); err != nil && !strings.Contains(got, "e") {
			t.Errorf("Number(%v) = %s: %v", x, got, err)
		}
	}
}

// TestCheckHeaders holds headers to the ratelimit-headers draft: whole
// quotas, a quota unit from the draft's list, no window for concurrent
// requests, and integers in the single-value headers.
func TestCheckHeaders(t *testing.T) {
	get := func(h map[string]string) func(string) string { return func(n string) string { return h[n] } }
	for _, good := range []map[string]string{
		{"RateLimit-Policy": `"free";q=20;w=2`, "RateLimit": `"free";r=7;t=2`, "RateLimit-Limit": "20", "RateLimit-Remaining": "7", "RateLimit-Reset": "2"},
		{"RateLimit-Policy": `"slots";q=3;qu="concurrent-requests", "free";q=20;w=2`, "RateLimit": `"slots";r=1, "free";r=0;t=3`, "Retry-After": "3"},
		{"RateLimit-Policy": `"off";q=0`, "RateLimit": `"off";r=0`, "RateLimit-Limit": "0"},
		{"RateLimit-Policy": `"b";q=100;qu="content-bytes";w=1, "r";q=1;qu="requests";w=1`},
	} {
		if err := CheckHeaders(get(good)); err != nil {
			t.Errorf("%v: %v", good, err)
		}
	}
	for _, bad := range []map[string]string{
		{"RateLimit-Policy": `"a";q=2.5;w=1`},                         // a fractional quota
		{"RateLimit-Policy": `"a";q=-1;w=1`},                          // a negative quota
		{"RateLimit-Policy": `"a";w=1`},                               // no quota
		{"RateLimit-Policy": `"a";q=1;w=0`},                           // a zero window
		{"RateLimit-Policy": `"a";q=1;w=1.5`},                         // a fractional window
		{"RateLimit-Policy": `"a";q=1;qu="slots"`},                    // not a quota unit
		{"RateLimit-Policy": `"a";q=1;qu=requests`},                   // a token, not a string
		{"RateLimit-Policy": `"a";q=3;qu="concurrent-requests";w=30`}, // concurrent requests in a window
		{"RateLimit-Policy": `"a";q=1;q=2`},                           // twice
		{"RateLimit-Policy": `"a";q=1;x=2`},                           // unknown
		{"RateLimit-Policy": `a;q=1`},                                 // a token name
		{"RateLimit": `"a";t=1`},                                      // no remaining
		{"RateLimit": `"a";r=1.5`},                                    // a fractional remaining
		{"RateLimit": `"a";r=1;t=-1`},                                 // a negative reset
		{"RateLimit-Limit": "2.5"},
		{"RateLimit-Remaining": "-1"},
		{"RateLimit-Reset": "1;w=1"},
		{"Retry-After": "1.5"},
	} {
		if err := CheckHeaders(get(bad)); err == nil {
			t.Errorf("%v: accepted", bad)
		}
	}
}
