package rules

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/bad/*.err from the loader's output")

// TestBadFiles loads every file of testdata/bad and compares the error
// with the exact message in the .err file beside it: one fixture per
// validation error, as drip check prints it.
func TestBadFiles(t *testing.T) {
	t.Setenv("DRIP_TEST_SHORT_SECRET", "too short")
	files, err := filepath.Glob("testdata/bad/*")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, path := range files {
		ext := filepath.Ext(path)
		if ext != ".json" && ext != ".yaml" {
			continue
		}
		n++
		t.Run(filepath.Base(path), func(t *testing.T) {
			set, err := Load(path)
			if err == nil {
				t.Fatalf("loaded %d rules; want an error", len(set.Rules))
			}
			var re *Error
			if !errors.As(err, &re) {
				t.Fatalf("error %T %v; want *rules.Error", err, err)
			}
			if re.File != path || len(re.Problems) == 0 {
				t.Fatalf("Error{File: %q, %d problems}; want File %q and problems", re.File, len(re.Problems), path)
			}
			got := err.Error() + "\n"
			want := strings.TrimSuffix(path, ext) + ".err"
			if *update {
				if err := os.WriteFile(want, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			b, err := os.ReadFile(want)
			if err != nil {
				t.Fatalf("no expected message: %v (go test ./rules -run TestBadFiles -update writes it)", err)
			}
			if got != string(b) {
				t.Errorf("error:\n%s\nwant (%s):\n%s", got, want, b)
			}
		})
	}
	if n < 50 {
		t.Fatalf("only %d fixtures found", n)
	}
	// Every .err has its fixture.
	errs, _ := filepath.Glob("testdata/bad/*.err")
	for _, e := range errs {
		base := strings.TrimSuffix(e, ".err")
		if _, err1 := os.Stat(base + ".json"); err1 != nil {
			if _, err2 := os.Stat(base + ".yaml"); err2 != nil {
				t.Errorf("%s has no fixture", e)
			}
		}
	}
}

// TestGoodFiles loads every file of testdata/good.
func TestGoodFiles(t *testing.T) {
	t.Setenv("DRIP_TEST_JWT_SECRET", "0123456789abcdef0123456789abcdef")
	files, _ := filepath.Glob("testdata/good/*")
	n := 0
	for _, path := range files {
		if ext := filepath.Ext(path); ext != ".json" && ext != ".yaml" && ext != ".yml" || strings.HasSuffix(path, ".jwks.json") {
			continue
		}
		n++
		if _, err := Load(path); err != nil {
			t.Errorf("%v", err)
		}
	}
	if n == 0 {
		t.Fatal("no good fixtures")
	}
}
