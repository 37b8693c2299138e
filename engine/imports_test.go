package engine_test

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// deps is the packages dir imports, directly or through this module's own
// packages (whose imports are followed), outside tests.
func deps(t *testing.T, dir string) map[string]bool {
	const module = "github.com/driplimit/drip"
	seen := map[string]bool{}
	var walk func(dir string)
	walk = func(dir string) {
		pkg, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range pkg.Imports {
			if seen[imp] {
				continue
			}
			seen[imp] = true
			if rest, ok := strings.CutPrefix(imp, module+"/"); ok {
				walk(filepath.Join("..", filepath.FromSlash(rest)))
			}
		}
	}
	walk(dir)
	return seen
}

// TestImports: the engine knows no transport and no concrete store
// (rendering is the front doors', the local fallback's store is handed
// in), and the rules file knows nothing of the engine.
func TestImports(t *testing.T) {
	for imp := range deps(t, ".") {
		if imp == "net/http" || strings.HasPrefix(imp, "github.com/driplimit/drip/store/") ||
			strings.HasPrefix(imp, "github.com/driplimit/drip/internal/door/frontdoor") {
			t.Errorf("package engine imports %s", imp)
		}
	}
	for imp := range deps(t, "../rules") {
		if strings.HasPrefix(imp, "github.com/driplimit/drip/engine") {
			t.Errorf("package rules imports %s", imp)
		}
	}
}

// TestInternalLevels: internal/ has three floors. Leaves import no
// package of this module but other leaves. The front doors' kit
// (internal/door/) is above the engine. Test kits (internal/testkit/)
// are imported by tests, storetest and each other only. Envoy's service
// takes its local fallback from internal/door/local, not the HTTP kit.
func TestInternalLevels(t *testing.T) {
	for _, v := range layerViolations(t, "..") {
		t.Error(v)
	}
}

// layerViolations lists the imports of the module's non-test files that
// run against the floors of internal/.
func layerViolations(t *testing.T, root string) []string {
	const module = "github.com/driplimit/drip/"
	const in = module + "internal/"
	leaf := func(p string) bool {
		rest, ok := strings.CutPrefix(p, in)
		return ok && !strings.HasPrefix(rest, "door/") && !strings.HasPrefix(rest, "testkit/")
	}
	var bad []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if path != root {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
			if n := d.Name(); n == "testdata" || strings.HasPrefix(n, ".") {
				return filepath.SkipDir
			}
		}
		pkg, err := build.ImportDir(path, 0)
		if err != nil {
			return nil // no Go files
		}
		rel, _ := filepath.Rel(root, path)
		self := module + filepath.ToSlash(rel)
		for _, imp := range pkg.Imports {
			if !strings.HasPrefix(imp, module) && imp+"/" != module {
				continue
			}
			switch {
			case leaf(self) && !leaf(imp):
				bad = append(bad, self+" (a leaf) imports "+imp)
			case strings.HasPrefix(imp, in+"testkit/") && !strings.HasPrefix(self, in+"testkit/") && self != module+"storetest":
				bad = append(bad, self+" imports the test kit "+imp)
			case self == module+"server/envoy" && imp == in+"door/frontdoor":
				bad = append(bad, self+" imports the HTTP door kit")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return bad
}
