// Command docwords measures the doc comments of exported names: how many
// words a sentence has on average, per package and overall. Comments of
// deprecated names are left out. It reads the
// packages named on its command line (directories); STYLE.md asks for
// about 12, as in x/time/rate, log/slog and net/http.
//
//	go run ./internal/docwords . engine httplimit grpclimit store rules
//
// With -long n it also lists the comments with a sentence over n words,
// the longest first, to say where to start.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"unicode"
)

var long = flag.Int("long", 0, "list the comments with a sentence over this many words")

func main() {
	flag.Parse()
	var words, sentences int
	for _, dir := range flag.Args() {
		w, s, err := measure(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%-12s %6d words %5d sentences %5.1f words a sentence\n", dir, w, s, ratio(w, s))
		words += w
		sentences += s
	}
	fmt.Printf("%-12s %6d words %5d sentences %5.1f words a sentence\n", "all", words, sentences, ratio(words, sentences))
}

func ratio(w, s int) float64 {
	if s == 0 {
		return 0
	}
	return float64(w) / float64(s)
}

// measure counts the words and sentences of the doc comments of the
// exported names of the package in dir (tests excluded).
func measure(dir string) (words, sentences int, err error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	pkgs := map[string][]*ast.File{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			return 0, 0, err
		}
		pkgs[f.Name.Name] = append(pkgs[f.Name.Name], f)
	}
	var texts []string
	for name, files := range pkgs {
		if name == "main" {
			continue
		}
		d, err := doc.NewFromFiles(fset, files, dir)
		if err != nil {
			return 0, 0, err
		}
		texts = append(texts, d.Doc)
		for _, v := range append(d.Consts, d.Vars...) {
			texts = append(texts, v.Doc)
		}
		for _, f := range d.Funcs {
			texts = append(texts, f.Doc)
		}
		for _, t := range d.Types {
			texts = append(texts, t.Doc)
			texts = append(texts, fieldDocs(t.Decl)...)
			for _, v := range append(t.Consts, t.Vars...) {
				texts = append(texts, v.Doc)
			}
			for _, f := range append(t.Funcs, t.Methods...) {
				texts = append(texts, f.Doc)
			}
		}
	}
	for _, t := range texts {
		if strings.HasPrefix(t, "Deprecated:") || strings.Contains(t, "\nDeprecated:") {
			continue // kept for old callers, not read by new ones
		}
		w, s := count(t)
		words += w
		sentences += s
		if *long > 0 && longest(t) > *long {
			fmt.Printf("%s: %d words: %.70q\n", dir, longest(t), t)
		}
	}
	return words, sentences, nil
}

// fieldDocs returns the comments of a type's exported fields and
// interface methods.
func fieldDocs(decl *ast.GenDecl) []string {
	var out []string
	for _, spec := range decl.Specs {
		ts, ok := spec.(*ast.TypeSpec)
		if !ok || !ts.Name.IsExported() {
			continue
		}
		var fl *ast.FieldList
		switch t := ts.Type.(type) {
		case *ast.StructType:
			fl = t.Fields
		case *ast.InterfaceType:
			fl = t.Methods
		}
		if fl == nil {
			continue
		}
		for _, f := range fl.List {
			exported := len(f.Names) == 0
			for _, n := range f.Names {
				exported = exported || n.IsExported()
			}
			if exported && f.Doc != nil {
				out = append(out, f.Doc.Text())
			}
		}
	}
	return out
}

// count returns the words and sentences of a comment's prose: code
// blocks (indented lines) are skipped, and a sentence ends with '.', '?'
// or '!' before a space or the end of a paragraph, or at a paragraph's
// end without one (a heading, a list item).
func count(text string) (words, sentences int) {
	for _, para := range strings.Split(text, "\n\n") {
		var prose []string
		for _, line := range strings.Split(para, "\n") {
			if strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
				continue
			}
			prose = append(prose, line)
		}
		inSentence := false
		for _, w := range strings.Fields(strings.Join(prose, " ")) {
			if !strings.ContainsFunc(w, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }) {
				continue
			}
			words++
			inSentence = true
			if end := strings.TrimRight(w, `)"'`); strings.HasSuffix(end, ".") || strings.HasSuffix(end, "?") || strings.HasSuffix(end, "!") {
				if !abbreviation(end) {
					sentences++
					inSentence = false
				}
			}
		}
		if inSentence {
			sentences++
		}
	}
	return words, sentences
}

// longest returns the words of the longest sentence of text.
func longest(text string) int {
	n := 0
	for _, para := range strings.Split(text, "\n\n") {
		for _, s := range splitSentences(para) {
			if w, _ := count(s); w > n {
				n = w
			}
		}
	}
	return n
}

// splitSentences splits a paragraph where count ends a sentence.
func splitSentences(para string) []string {
	var out []string
	var cur []string
	for _, w := range strings.Fields(para) {
		cur = append(cur, w)
		if end := strings.TrimRight(w, `)"'`); (strings.HasSuffix(end, ".") || strings.HasSuffix(end, "?") || strings.HasSuffix(end, "!")) && !abbreviation(end) {
			out = append(out, strings.Join(cur, " "))
			cur = nil
		}
	}
	if len(cur) > 0 {
		out = append(out, strings.Join(cur, " "))
	}
	return out
}

// abbreviation reports whether a word ending in '.' ends no sentence.
func abbreviation(w string) bool {
	switch strings.ToLower(strings.TrimLeft(w, `("'`)) {
	case "e.g.", "i.e.", "etc.", "vs.", "...":
		return true
	}
	return strings.HasSuffix(w, "...") && !strings.HasSuffix(w, "....")
}
