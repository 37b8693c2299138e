package engine_test

import (
	"go/build"
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
			strings.HasPrefix(imp, "github.com/driplimit/drip/internal/frontdoor") {
			t.Errorf("package engine imports %s", imp)
		}
	}
	for imp := range deps(t, "../rules") {
		if strings.HasPrefix(imp, "github.com/driplimit/drip/engine") {
			t.Errorf("package rules imports %s", imp)
		}
	}
}
