package rules

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCleanPath(t *testing.T) {
	folded, exact := &Set{}, &Set{ExactPaths: true}
	for _, c := range []struct {
		in, want, wantExact string // "" for a *PathError
	}{
		{"", "/", "/"},
		{"*", "*", "*"},
		{"/", "/", "/"},
		{"/api/v1/x", "/api/v1/x", "/api/v1/x"},
		{"api/x", "/api/x", "/api/x"},
		{"/api/", "/api/", "/api/"},
		{"/.well-known/x", "/.well-known/x", "/.well-known/x"},
		{"/a.b/c.d", "/a.b/c.d", "/a.b/c.d"},
		// Decoded once.
		{"/%61pi/%7Ex", "/api/~x", "/api/~x"},
		{"/caf%C3%A9", "/café", "/café"},
		{"/files/100%25", "/files/100%", "/files/100%"},
		{"/files/100%25x", "/files/100%x", "/files/100%x"},
		{"/a%2Fb/c", "/a/b/c", "/a/b/c"},
		// Parameters, per segment, raw or encoded.
		{"/admin;/x", "/admin/x", "/admin/x"},
		{"/admin;x=1/y", "/admin/y", "/admin/y"},
		{"/admin;jsessionid=abc/x", "/admin/x", "/admin/x"},
		{"/admin%3Bx/y", "/admin/y", "/admin/y"},
		{"/x/..;/admin/x", "/admin/x", "/admin/x"},
		{"/x/.;a=b/admin", "/x/admin", "/x/admin"},
		{"/admin/x;v=1", "/admin/x", "/admin/x"},
		{"/admin/;", "/admin/", "/admin/"},
		// Dot segments and empty segments.
		{"//admin//x", "/admin/x", "/admin/x"},
		{"/x/../admin", "/admin", "/admin"},
		{"/../admin", "/admin", "/admin"},
		{"/api/x/..", "/api/", "/api/"},
		{"/api/.", "/api/", "/api/"},
		{"/api/x/%2e%2e", "/api/", "/api/"},
		{"/..", "/", "/"},
		{"/a/./b/../../c/", "/c/", "/c/"},
		// Case, and trailing dots and spaces (unless exact).
		{"/ADMIN/X", "/admin/x", "/ADMIN/X"},
		{"/admin./x", "/admin/x", "/admin./x"},
		{"/admin%20/x", "/admin/x", "/admin /x"},
		{"/Admin.%20./x", "/admin/x", "/Admin. ./x"},
		{"/x/%20/y", "/x/y", "/x/ /y"},
		{"/x/...", "", "/x/..."},
		{"/x/..%20/admin", "", "/x/.. /admin"},
		{"/%E2%84%AAiosk", "/kiosk", "/\u212aiosk"}, // the Kelvin sign
		{"/%C5%BFearch", "/search", "/\u017fearch"}, // long s: "S" in upper case
		// Ambiguous, in either mode.
		{"/%2561dmin/x", "", ""},
		{"/%25%36%31dmin", "", ""},
		{"/admin%00/x", "", ""},
		{"/admin%0a/x", "", ""},
		{"/admin%7F", "", ""},
		{"/x/..%5Cadmin", "", ""},
		{`/x\admin`, "", ""},
		{"/%C0%AE%C0%AE/admin", "", ""},
		{"/%ff", "", ""},
		{"/x/..%2Fadmin/x", "", ""},
		{"/admin/x%2F..%2F..%2Fy", "", ""},
		{"/a%2Fb/./c", "", ""},
		{"/%zz", "", ""},
		{"/%4", "", ""},
		{"/a%", "", ""},
	} {
		for _, m := range []struct {
			set  *Set
			want string
		}{{folded, c.want}, {exact, c.wantExact}} {
			got, err := m.set.CleanPath(c.in)
			var pe *PathError
			switch {
			case m.want == "" && (!errors.As(err, &pe) || !strings.HasPrefix(err.Error(), "ambiguous request path: ")):
				t.Errorf("exact %v: CleanPath(%q) = %q, %v; want a *PathError", m.set.ExactPaths, c.in, got, err)
			case m.want != "" && (err != nil || got != m.want):
				t.Errorf("exact %v: CleanPath(%q) = %q, %v; want %q", m.set.ExactPaths, c.in, got, err, m.want)
			}
			// Clean paths stay as they are (for those that are paths as
			// sent: with no '%' left, no space).
			if err == nil && !strings.ContainsAny(got, "% \u212a\u017f") {
				if again, err := m.set.CleanPath(got); err != nil || again != got {
					t.Errorf("exact %v: CleanPath(%q) = %q, %v; want it unchanged", m.set.ExactPaths, got, again, err)
				}
			}
		}
	}
}

func TestFoldPath(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{"/API/x", "/api/X"},
		{"/\u212a", "/k"},
		{"/\u017f", "/S"},
		{"/Straße", "/STRAßE"},
		{"/ǅ", "/ǆ"}, // titlecase
	} {
		if FoldPath(c.a) != FoldPath(c.b) {
			t.Errorf("FoldPath(%q) = %q, FoldPath(%q) = %q: want equal", c.a, FoldPath(c.a), c.b, FoldPath(c.b))
		}
	}
	if FoldPath("/a/b") != "/a/b" || FoldPath("/A/B") != "/a/b" {
		t.Errorf("FoldPath: %q %q", FoldPath("/a/b"), FoldPath("/A/B"))
	}
}

func TestCleanMethod(t *testing.T) {
	for in, want := range map[string]string{"GET": "GET", "post": "POST", "Delete": "DELETE", "M-SEARCH": "M-SEARCH"} {
		if got := CleanMethod(in); got != want {
			t.Errorf("CleanMethod(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestMatchTextFolded: a rules file's path and method matches are read
// as requests' are, so "post" and "/Admin/*" match what they say; with
// exact_paths the path keeps its case.
func TestMatchTextFolded(t *testing.T) {
	const src = `{%s"rules": [{"name": "r", "limit_keys": ["global"],
		"match": {"path": ["/Admin/*", "/Exact"], "method": "post"}, "algorithm_config": {"rps": 1}}]}`
	for _, c := range []struct {
		top                  string
		values, prefixes, ms []string
	}{
		{"", []string{"/exact"}, []string{"/admin/"}, []string{"POST"}},
		{`"exact_paths": false, `, []string{"/exact"}, []string{"/admin/"}, []string{"POST"}},
		{`"exact_paths": true, `, []string{"/Exact"}, []string{"/Admin/"}, []string{"POST"}},
	} {
		set, err := Parse([]byte(strings.Replace(src, "%s", c.top, 1)), "r.json")
		if err != nil {
			t.Fatal(err)
		}
		m := set.Rules[0].Match
		if len(m) != 2 || !slices.Equal(m[0].Values, c.values) || !slices.Equal(m[0].Prefixes, c.prefixes) || !slices.Equal(m[1].Values, c.ms) {
			t.Errorf("%s: match %+v", c.top, m)
		}
		if !set.ReadsPath() {
			t.Errorf("%s: ReadsPath false", c.top)
		}
	}
	// A match no request's path can meet is a problem (testdata/bad/
	// match_path.json), but trailing dots are a path's own with exact_paths.
	dotted := `"rules": [{"name": "r", "limit_keys": ["global"], "match": {"path": "/API./*"}, "algorithm_config": {"rps": 1}}]}`
	if set, err := Parse([]byte(`{"exact_paths": true, `+dotted), "r.json"); err != nil || set.Rules[0].Match[0].Prefixes[0] != "/API./" {
		t.Errorf("exact_paths, /API./*: %v", err)
	}
	if _, err := Parse([]byte(`{`+dotted), "r.json"); err == nil || !strings.Contains(err.Error(), `"/api./*" never matches: a request's path is read as "/api/*"`) {
		t.Errorf("/API./*: %v", err)
	}
	if _, err := Parse([]byte(`{"exact_paths": "yes", "rules": []}`), "r.json"); err == nil || !strings.Contains(err.Error(), "exact_paths: must be true or false") {
		t.Errorf("exact_paths \"yes\": %v", err)
	}
	if Default().ReadsPath() {
		t.Error("the default rules read the path")
	}
}

// FuzzCleanPath: CleanPath never panics; what it returns is a clean path
// (no empty, "." or ".." segment, no ';', no control character, UTF-8),
// folded unless exact, and cleaning it again changes nothing when it
// holds nothing that would decode ('%').
func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/admin;/x", "/x/..;/admin/x", "/%2561dmin/x", "/Admin.%20./x", "/a%2Fb/../c", "//a/./b/..", "/%C5%BF"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, in string, exact bool) {
		set := &Set{ExactPaths: exact}
		got, err := set.CleanPath(in)
		if err != nil {
			var pe *PathError
			if !errors.As(err, &pe) {
				t.Fatalf("CleanPath(%q): %T %v", in, err, err)
			}
			return
		}
		if got == "*" && in == "*" {
			return
		}
		segs := strings.Split(got, "/")
		if segs[0] != "" || strings.ContainsAny(got, ";\\") || !utf8.ValidString(got) {
			t.Fatalf("CleanPath(%q) = %q", in, got)
		}
		for i, s := range segs[1:] {
			if s == "." || s == ".." || (s == "" && i != len(segs)-2) {
				t.Fatalf("CleanPath(%q) = %q: segment %q", in, got, s)
			}
		}
		for _, c := range []byte(got) {
			if c < 0x20 || c == 0x7f {
				t.Fatalf("CleanPath(%q) = %q: a control character", in, got)
			}
		}
		if !exact && FoldPath(got) != got {
			t.Fatalf("CleanPath(%q) = %q: not folded", in, got)
		}
		if !strings.ContainsAny(got, "% ") {
			if again, err := set.CleanPath(got); err != nil || again != got {
				t.Fatalf("CleanPath(%q) = %q, then %q, %v", in, got, again, err)
			}
		}
	})
}
