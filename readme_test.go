package drip_test

import (
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// snippet is a ```go block of a Markdown file.
type snippet struct {
	file string
	line int // of the opening fence
	code string
}

// goBlocks returns the ```go blocks of a Markdown file, fences indented
// under a list item too (their indentation is taken off every line).
func goBlocks(file string, data []byte) []snippet {
	var out []snippet
	var cur *snippet
	var indent string
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == nil {
			if trimmed == "```go" {
				indent = line[:strings.Index(line, "`")]
				cur = &snippet{file: file, line: i + 1}
			}
			continue
		}
		if trimmed == "```" {
			out = append(out, *cur)
			cur = nil
			continue
		}
		cur.code += strings.TrimPrefix(line, indent) + "\n"
	}
	return out
}

// TestReadmeSnippets holds every Go block of README.md, CONTRIBUTING.md
// and docs/*.md to being a whole program, formatted as gofmt formats it,
// that compiles against this repository: each block is a package of one module that
// requires drip (replaced by this directory) at the dependency versions
// of drip's go.mod, from the module cache, and go vet type-checks them
// all at once as the compiler does (a go build would add some 45 s of
// linking eleven programs, and find nothing more). A block that needs a
// server reads its URL from the environment and refuses to start
// without it.
func TestReadmeSnippets(t *testing.T) {
	t.Parallel() // it waits on the go command most of the time
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var snippets []snippet
	for _, f := range append([]string{"README.md", "CONTRIBUTING.md"}, files...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		snippets = append(snippets, goBlocks(f, data)...)
	}
	if len(snippets) < 9 {
		t.Fatalf("found %d Go blocks in README.md, CONTRIBUTING.md and docs/*.md, which hold more", len(snippets))
	}

	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	gosum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mod := regexp.MustCompile(`(?m)^module .*$`).ReplaceAll(gomod, []byte("module snippets"))
	mod = fmt.Appendf(mod, "\nrequire github.com/driplimit/drip v0.0.0-00010101000000-000000000000\n\nreplace github.com/driplimit/drip => %s\n", strconv.Quote(root))
	write(t, filepath.Join(dir, "go.mod"), mod)
	write(t, filepath.Join(dir, "go.sum"), gosum)

	where := map[string]snippet{} // package directory -> its block
	for i, s := range snippets {
		at := fmt.Sprintf("%s:%d", s.file, s.line)
		f, err := parser.ParseFile(token.NewFileSet(), at, s.code, parser.SkipObjectResolution)
		if err != nil {
			t.Errorf("%s: the Go block does not parse: %v", at, err)
			continue
		}
		if f.Name.Name != "main" || !hasMain(f) {
			t.Errorf("%s: the Go block is not a whole program (package main with func main)", at)
			continue
		}
		if formatted, err := format.Source([]byte(s.code)); err == nil && !bytes.Equal(formatted, []byte(s.code)) {
			t.Errorf("%s: the Go block is not formatted as gofmt formats it:\n%s", at, formatted)
		}
		pkg := fmt.Sprintf("s%02d", i)
		where[pkg] = s
		write(t, filepath.Join(dir, pkg, "main.go"), []byte(s.code))
	}
	if t.Failed() {
		return
	}

	cmd := exec.Command("go", "vet", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		// Say where in the Markdown each problem is.
		msg := regexp.MustCompile(`(?:\./)?(s\d\d)/main\.go:(\d+)`).ReplaceAllStringFunc(string(out), func(m string) string {
			parts := regexp.MustCompile(`(s\d\d)/main\.go:(\d+)`).FindStringSubmatch(m)
			s := where[parts[1]]
			n, _ := strconv.Atoi(parts[2])
			return fmt.Sprintf("%s:%d", s.file, s.line+n)
		})
		t.Fatalf("go vet of the Go blocks: %v\n%s", err, msg)
	}

	// The blocks that read a server's URL from the environment refuse to
	// run without it, rather than reach some default server.
	getenv := regexp.MustCompile(`os\.Getenv\("([A-Z_]+)"\)`)
	var pkgs []string
	for pkg, s := range where {
		if getenv.MatchString(s.code) {
			pkgs = append(pkgs, "./"+pkg)
		}
	}
	if len(pkgs) == 0 {
		return
	}
	slices.Sort(pkgs)
	bin := filepath.Join(dir, "bin")
	cmd = exec.Command("go", append([]string{"build", "-o", bin + string(filepath.Separator)}, pkgs...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, pkg := range pkgs {
		s := where[pkg[2:]]
		var vars []string // the variables the block reads
		for _, m := range getenv.FindAllStringSubmatch(s.code, -1) {
			vars = append(vars, m[1])
		}
		var env []string
		for _, kv := range os.Environ() {
			name, _, _ := strings.Cut(kv, "=")
			if !strings.HasPrefix(name, "PG") && !slices.Contains(vars, name) {
				env = append(env, kv)
			}
		}
		// Should a block reach for pgx's default server after all, it finds
		// none: PGHOST names a directory with no socket in it.
		env = append(env, "PGHOST="+filepath.Join(dir, "no-server"), "PGCONNECT_TIMEOUT=1")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, filepath.Join(bin, pkg[2:]))
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		cancel()
		for _, v := range vars {
			if err == nil || !strings.Contains(string(out), v+" is not set") {
				t.Errorf("%s:%d: with %s unset, the program ends with %v, saying %q; want a failure saying %q", s.file, s.line, v, err, out, v+" is not set")
			}
		}
	}
}

func hasMain(f *ast.File) bool {
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.Name == "main" {
			return true
		}
	}
	return false
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLibraryShowsCalls: docs/library.md shows each of the Limiter's
// calls a user starts from in a Go block (which TestReadmeSnippets
// compiles), not only in its prose: a call named and never shown is a
// call a reader must guess at.
func TestLibraryShowsCalls(t *testing.T) {
	data, err := os.ReadFile("docs/library.md")
	if err != nil {
		t.Fatal(err)
	}
	called := map[string]bool{}
	for _, s := range goBlocks("docs/library.md", data) {
		f, err := parser.ParseFile(token.NewFileSet(), "", s.code, parser.SkipObjectResolution)
		if err != nil {
			continue // TestReadmeSnippets reports it
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok {
				if sel, ok := c.Fun.(*ast.SelectorExpr); ok {
					called[sel.Sel.Name] = true
				}
			}
			return true
		})
	}
	for _, name := range []string{"Take", "Allow", "Reserve", "Wait", "TakeMulti", "Acquire", "Release"} {
		if !called[name] {
			t.Errorf("docs/library.md has no Go block that calls %s", name)
		}
	}
}
