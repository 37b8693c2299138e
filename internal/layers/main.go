// Command layers counts the imports of the module's non-test files that
// run against ARCHITECTURE.md's levels, and with -v lists them:
//
//	go run ./internal/layers -v
//
// The levels, lowest first: bucket, store, the root, the stores and
// override (replay and storetest beside them), engine and rules, the front
// doors' kit (internal/door/), the front doors (topkeys and pace beside
// them), server (and simulate), then cmd/, examples/ and deploy. A package
// imports its own level or lower. Every other package under internal/ is
// a leaf: it imports leaves only. Test kits (internal/testkit/, xdstest)
// are for tests, storetest and each other.
package main

import (
	"flag"
	"fmt"
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

const module = "github.com/driplimit/drip"

const (
	leaf    = -1
	testkit = 100
)

// level places a package (its path in the module, "" for the root).
func level(p string) int {
	switch p {
	case "bucket":
		return 0
	case "store":
		return 1
	case "":
		return 2
	case "override", "replay", "storetest":
		return 3
	case "engine", "rules":
		return 4
	case "httplimit", "httplimit/promobserver", "grpclimit", "server/envoy", "server/envoy/xds", "topkeys", "pace":
		return 6
	case "server", "simulate":
		return 7
	case "deploy":
		return 8
	case "server/envoy/xds/xdstest":
		return testkit
	}
	switch {
	case strings.HasPrefix(p, "store/"):
		return 3
	case strings.HasPrefix(p, "internal/door/"):
		return 5
	case strings.HasPrefix(p, "internal/testkit/"):
		return testkit
	case strings.HasPrefix(p, "internal/"):
		return leaf
	}
	return 8 // cmd/, examples/
}

func main() {
	verbose := flag.Bool("v", false, "list each import")
	flag.Parse()
	n := 0
	filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if path != "." {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			if n := d.Name(); n == "testdata" || strings.HasPrefix(n, ".") {
				return filepath.SkipDir
			}
		}
		pkg, err := build.ImportDir(path, 0)
		if err != nil {
			return nil
		}
		self := filepath.ToSlash(path)
		if self == "." {
			self = ""
		}
		for _, imp := range pkg.Imports {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := strings.TrimPrefix(strings.TrimPrefix(imp, module), "/")
			a, b := level(self), level(to)
			why := ""
			switch {
			case a == leaf && b != leaf:
				why = "a leaf imports a non-leaf"
			case b == testkit && a != testkit && self != "storetest":
				why = "imports a test kit"
			case self == "server/envoy" && (to == "internal/frontdoor" || to == "internal/door/frontdoor"):
				why = "Envoy imports the HTTP door kit"
			case a != testkit && b != testkit && b > a:
				why = "upward"
			}
			if why != "" {
				n++
				if *verbose {
					fmt.Printf("%s -> %s (%s)\n", "/"+self, "/"+to, why)
				}
			}
		}
		return nil
	})
	fmt.Println(n, "imports against the layering")
}
