package rules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzParse feeds the decoder arbitrary JSON and YAML: it must never
// panic, a failure must be an *Error with at least one problem, and a set
// it accepts must hold only usable rules. Parse runs without an
// environment; ParseEnv, given one that records what it is asked, must
// ask for exactly what Parse named in the set's jwt section, and accept
// no file Parse refused.
func FuzzParse(f *testing.F) {
	for _, dir := range []string{"testdata/bad", "testdata/good"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil && !strings.HasSuffix(p, ".err") {
				f.Add(b, filepath.Ext(p) == ".yaml")
			}
		}
	}
	f.Add(DefaultJSON, false)
	f.Add([]byte("rules: &a [*a]"), true)
	f.Add([]byte("a: &a [*a, *a]\nb: &b [*a, *a]\nc: [*b, *b, *b]\nrules: []"), true)
	f.Fuzz(func(t *testing.T, data []byte, yaml bool) {
		name := "fuzz.json"
		if yaml {
			name = "fuzz.yaml"
		}
		watchdog := time.AfterFunc(time.Minute, func() { panic(fmt.Sprintf("Parse(%q, %q) hangs", data, name)) })
		set, err := Parse(data, name)
		watchdog.Stop()
		var vars, files []string
		env := Env{
			Getenv:   func(n string) string { vars = append(vars, n); return "" },
			ReadFile: func(p string) ([]byte, error) { files = append(files, p); return nil, os.ErrNotExist },
		}
		if _, envErr := ParseEnv(data, name, env); err != nil && envErr == nil {
			t.Fatalf("ParseEnv accepts what Parse refused: %v", err)
		}
		var named []string
		if err == nil && set.JWT != nil {
			if set.JWT.HMACSecretEnv != "" {
				named = append(named, set.JWT.HMACSecretEnv)
			}
			named = append(named, set.JWT.PublicKeyFiles...)
			if set.JWT.JWKSFile != "" {
				named = append(named, set.JWT.JWKSFile)
			}
			if len(set.JWT.HMACSecret) > 0 || len(set.JWT.Keys) > 0 {
				t.Fatal("Parse read a secret or a key")
			}
		}
		if asked := append(vars, files...); err == nil && strings.Join(asked, "\n") != strings.Join(named, "\n") {
			t.Fatalf("ParseEnv asked for %q; Parse named %q", asked, named)
		}
		if err != nil {
			var re *Error
			if !errors.As(err, &re) || len(re.Problems) == 0 || re.File != name {
				t.Fatalf("error %T %v", err, err)
			}
			for _, p := range re.Problems {
				if p.Message == "" {
					t.Fatalf("empty message at %q", p.Path)
				}
			}
			return
		}
		seen := map[string]bool{}
		for i := range set.Rules {
			r := &set.Rules[i]
			if !validName(r.Name) || seen[r.Name] {
				t.Fatalf("rule name %q", r.Name)
			}
			seen[r.Name] = true
			if err := r.Limit.Validate(); err != nil {
				t.Fatalf("rule %q: %v", r.Name, err)
			}
			if len(r.LimitKeys) == 0 || r.FixedCost <= 0 || r.DefaultCost <= 0 || r.FixedCost > burstOf(r) || r.DefaultCost > burstOf(r) {
				t.Fatalf("rule %+v", r)
			}
			if got, ok := set.Rule(r.Name); !ok || got != r {
				t.Fatalf("Rule(%q)", r.Name)
			}
			if r.usesJWT() && set.JWT == nil {
				t.Fatalf("rule %q reads jwt: claims with no jwt setting", r.Name)
			}
		}
	})
}

func burstOf(r *Rule) float64 {
	if r.Limit.Burst == 0 {
		return r.Limit.Rate
	}
	return r.Limit.Burst
}

// FuzzKey checks that distinct values never share a bucket key.
func FuzzKey(f *testing.F) {
	f.Add("a|b", "c", "a", "b|c")
	f.Add(`a\`, "|b", `a\|`, "b")
	f.Add(strings.Repeat("x", 200), "", `\h`, "")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		r := &Rule{Name: "r", LimitKeys: []Source{{Kind: KindHeader, Name: "A"}, {Kind: KindGlobal, Name: ""}, {Kind: KindQuery, Name: "b"}}}
		k1, k2 := r.Key([]string{a, b}), r.Key([]string{c, d})
		if (a == c && b == d) != (k1 == k2) {
			t.Fatalf("Key(%q, %q) = %q, Key(%q, %q) = %q", a, b, k1, c, d, k2)
		}
		if !strings.HasPrefix(k1, "r|") {
			t.Fatalf("key %q", k1)
		}
	})
}
