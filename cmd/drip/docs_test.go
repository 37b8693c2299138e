package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"go.yaml.in/yaml/v3"

	"github.com/driplimit/drip/rules"
)

// docBlock is a fenced code block of a Markdown file.
type docBlock struct {
	file string
	line int // of the opening fence
	lang string
	text string
}

// docFiles are the Markdown files whose blocks the tests hold to the
// code, relative to the repository root.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"../../README.md", "../../CONTRIBUTING.md"}, files...)
	for i, f := range files {
		files[i] = strings.TrimPrefix(f, "../../")
	}
	return files
}

// docBlocks returns the fenced blocks of a Markdown file, fences indented
// under a list item too (their indentation is taken off every line).
func docBlocks(t *testing.T, file string) []docBlock {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("../..", file))
	if err != nil {
		t.Fatal(err)
	}
	var out []docBlock
	var cur *docBlock
	var indent string
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == nil {
			if strings.HasPrefix(trimmed, "```") {
				indent = line[:strings.Index(line, "`")]
				cur = &docBlock{file: file, line: i + 1, lang: strings.TrimPrefix(trimmed, "```")}
			}
			continue
		}
		if trimmed == "```" {
			out = append(out, *cur)
			cur = nil
			continue
		}
		cur.text += strings.TrimPrefix(line, indent) + "\n"
	}
	if cur != nil {
		t.Errorf("%s:%d: a code block is never closed", file, cur.line)
	}
	return out
}

// checkedLangs are the languages the documents' code blocks may be in:
// go blocks are compiled by the root package's TestReadmeSnippets, sh,
// json and yaml blocks are checked here, and text (output, headers, a
// fragment) and sql (the SQL functions, run by pgstore's tests) are the
// few left alone on purpose.
var checkedLangs = []string{"go", "sh", "json", "yaml", "text", "sql"}

// TestDocBlocks holds the code blocks of README.md, CONTRIBUTING.md and
// docs/*.md to the code: every block names a language this test knows;
// each drip command of a sh block parses with the command's real flags
// (drip check runs, on the repository's files; drip replay runs on the
// lines echo or printf feeds it, and drip simulate runs, each printing
// what the document shows after it); each make target exists;
// JSON blocks are JSON, and the rules files among them parse
// (rules.Parse), as do the YAML ones; envoyproxy/ratelimit configs pass
// drip check.
func TestDocBlocks(t *testing.T) {
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []docBlock
	for _, f := range docFiles(t) {
		blocks = append(blocks, docBlocks(t, f)...)
	}
	dir := t.TempDir()
	t.Chdir("../..") // the commands name the repository's files from its root
	var commands, files, replays, simulations int
	for i, b := range blocks {
		at := b.file + ":" + strconv.Itoa(b.line)
		switch b.lang {
		case "sh":
			replays += checkReplays(t, at, b.text)
			for _, cmd := range shellCommands(b.text) {
				switch {
				case len(cmd) > 0 && cmd[0] == "make":
					for _, target := range cmd[1:] {
						if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(makefile) {
							t.Errorf("%s: make %s: the Makefile has no such target", at, target)
						}
					}
				case dripArgs(cmd) != nil && dripArgs(cmd)[0] == "simulate" && i+1 < len(blocks) && blocks[i+1].lang == "text":
					commands++
					simulations++
					checkSimulation(t, at, dripArgs(cmd), blocks[i+1].text, dir)
				case dripArgs(cmd) != nil:
					commands++
					checkDripCommand(t, at, dripArgs(cmd))
				}
			}
		case "json":
			dec := json.NewDecoder(strings.NewReader(b.text))
			for {
				var v any
				if err := dec.Decode(&v); err != nil {
					if !errors.Is(err, io.EOF) {
						t.Errorf("%s: the JSON block is not JSON: %v", at, err)
					}
					break
				}
				obj, _ := v.(map[string]any)
				switch {
				case obj["rules"] != nil:
					files++
					parseRules(t, at, b.text)
				case obj["limit_keys"] != nil: // one rule of a rules file
					files++
					parseRules(t, at, `{"rules": [`+b.text+`]}`)
				}
			}
		case "yaml":
			files++
			switch {
			case regexp.MustCompile(`(?m)^rules:`).MatchString(b.text):
				parseRules(t, at, b.text)
			case regexp.MustCompile(`(?m)^apiVersion: `).MatchString(b.text):
				// A Kubernetes object (Envoy Gateway's configuration):
				// drip cannot check its meaning, but it must be YAML,
				// and an object of a kind with an API version.
				var obj struct {
					APIVersion string `yaml:"apiVersion"`
					Kind       string `yaml:"kind"`
				}
				if err := yaml.Unmarshal([]byte(b.text), &obj); err != nil || obj.APIVersion == "" || obj.Kind == "" {
					t.Errorf("%s: a Kubernetes object that does not parse (%v) or has no apiVersion and kind", at, err)
				}
			case regexp.MustCompile(`(?m)^rate_limits:`).MatchString(b.text):
				// Envoy's own rate limits of a route: drip cannot check
				// them, but each must be YAML, with actions, and only
				// the fields of Envoy's RateLimit.
				var obj struct {
					RateLimits []map[string]any `yaml:"rate_limits"`
				}
				if err := yaml.Unmarshal([]byte(b.text), &obj); err != nil || len(obj.RateLimits) == 0 {
					t.Errorf("%s: Envoy's rate_limits do not parse (%v) or are empty", at, err)
				}
				for j, rl := range obj.RateLimits {
					if rl["actions"] == nil {
						t.Errorf("%s: rate_limits[%d] has no actions", at, j)
					}
					for k := range rl {
						if !slices.Contains([]string{"stage", "disable_key", "actions", "limit", "hits_addend", "apply_on_stream_done"}, k) {
							t.Errorf("%s: rate_limits[%d].%s is not a field of Envoy's RateLimit", at, j, k)
						}
					}
				}
			default: // an envoyproxy/ratelimit config
				checkFile(t, at, filepath.Join(dir, "b"+strconv.Itoa(i)+".yaml"), []byte(b.text))
			}
		default:
			if !slices.Contains(checkedLangs, b.lang) {
				t.Errorf("%s: a code block in %q: name one of %q (text for output and fragments)", at, b.lang, checkedLangs)
			}
		}
	}
	t.Logf("%d blocks: %d drip commands (%d replays and %d simulations run), %d rules or config files checked", len(blocks), commands, replays, simulations, files)
	// Far fewer would mean the test lost its way in the documents.
	if commands < 15 || files < 4 || replays < 2 || simulations < 1 {
		t.Errorf("checked %d drip commands (%d replays and %d simulations run) and %d rules or config files; the documents hold more", commands, replays, simulations, files)
	}
}

// checkReplays runs each documented "echo 'line' | drip replay" and
// "printf '%s\n' 'line' ... | drip replay" of a sh block on its lines,
// and compares what it writes with the decisions the block shows after
// it (the lines starting with {). It returns how many it ran.
func checkReplays(t *testing.T, at, text string) int {
	t.Helper()
	lines := strings.Split(strings.ReplaceAll(text, "\\\n", " "), "\n")
	n := 0
	for i, line := range lines {
		producer, consumer, ok := strings.Cut(line, "|")
		if !ok {
			continue
		}
		cmds := shellCommands(consumer)
		if len(cmds) == 0 {
			continue
		}
		args := dripArgs(cmds[0])
		if len(args) == 0 || args[0] != "replay" {
			continue
		}
		var input string
		var w []string
		if pc := shellCommands(producer); len(pc) > 0 {
			w = pc[len(pc)-1]
		}
		switch {
		case len(w) == 2 && w[0] == "echo":
			input = w[1] + "\n"
		case len(w) > 2 && w[0] == "printf" && w[1] == `%s\n`:
			input = strings.Join(w[2:], "\n") + "\n"
		default:
			t.Errorf("%s: %s: a replay's input this test cannot read", at, line)
			continue
		}
		var want strings.Builder
		for _, l := range lines[i+1:] {
			if !strings.HasPrefix(l, "{") {
				break
			}
			want.WriteString(l + "\n")
		}
		if want.Len() == 0 {
			t.Errorf("%s: %s: the block shows no decisions after it", at, line)
			continue
		}
		n++
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, strings.NewReader(input), &stdout, &stderr); code != 0 {
			t.Errorf("%s: drip %s: exit %d\n%s", at, strings.Join(args, " "), code, stderr.String())
		} else if stdout.String() != want.String() {
			t.Errorf("%s: drip %s wrote\n%sthe document shows\n%s", at, strings.Join(args, " "), stdout.String(), want.String())
		}
	}
	return n
}

// checkSimulation runs a documented drip simulate, its chart written
// in dir, and compares what it prints with the text block after it.
func checkSimulation(t *testing.T, at string, args []string, want, dir string) {
	t.Helper()
	args = slices.Clone(args)
	svg := ""
	for i := range args {
		if args[i] == "--svg" && i+1 < len(args) {
			svg = args[i+1]
			args[i+1] = filepath.Join(dir, "chart.svg")
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), args, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Errorf("%s: drip %s: exit %d\n%s", at, strings.Join(args, " "), code, stderr.String())
		return
	}
	got := stdout.String()
	if svg != "" {
		got = strings.ReplaceAll(got, filepath.Join(dir, "chart.svg"), svg)
	}
	if got != want {
		t.Errorf("%s: drip %s printed\n%sthe document shows\n%s", at, strings.Join(args, " "), got, want)
	}
}

// checkDripCommand runs a documented drip command line: drip check for
// real, every other command with -h after its flags, so that each flag
// is parsed by the command's own flag set (a name it does not know or a
// value it cannot read fails) and nothing is served or written.
func checkDripCommand(t *testing.T, at string, args []string) {
	t.Helper()
	if args[0] != "check" {
		args = append(slices.Clone(args), "-h")
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(""), &stdout, &stderr)
	if code != 0 {
		t.Errorf("%s: drip %s: exit %d\n%s%s", at, strings.Join(args, " "), code, stdout.String(), stderr.String())
		return
	}
	if args[0] != "check" && !strings.HasPrefix(stdout.String(), "usage:") {
		// -h was not read as a flag: an argument before it stopped the
		// parsing, and the command ran.
		t.Errorf("%s: drip %s: the flags were not all parsed (an unexpected argument?):\n%s", at, strings.Join(args, " "), stdout.String())
	}
}

// parseRules parses a documented rules file as the loader does, without
// reading the files and variables it names (a JWKS file, a secret).
func parseRules(t *testing.T, at, text string) {
	t.Helper()
	if _, err := rules.Parse([]byte(text), at); err != nil {
		t.Errorf("%s: the rules file does not parse: %v", at, err)
	}
}

// checkFile writes a documented rules or config file and runs drip check
// on it.
func checkFile(t *testing.T, at, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"check", path}, nil, &stdout, &stderr); code != 0 {
		t.Errorf("%s: drip check of the block: exit %d\n%s%s", at, code, stdout.String(), stderr.String())
	}
}

// dripArgs returns the arguments of a drip command, written "drip ..."
// or "go run ./cmd/drip ...", or nil for another command.
func dripArgs(cmd []string) []string {
	switch {
	case len(cmd) > 1 && cmd[0] == "drip":
		return cmd[1:]
	case len(cmd) > 3 && cmd[0] == "go" && cmd[1] == "run" && cmd[2] == "./cmd/drip":
		return cmd[3:]
	}
	return nil
}

// shellCommands returns the simple commands of a sh block, as word lists:
// lines joined at a trailing backslash, # comments and the answers shown
// after a command (lines starting with {) dropped, pipelines and lists
// (|, &&, ||, ;) split, a subshell's parentheses and leading VAR=value
// assignments taken off.
func shellCommands(text string) [][]string {
	var cmds [][]string
	text = strings.ReplaceAll(text, "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "{") {
			continue
		}
		var cur []string
		flush := func() {
			for len(cur) > 0 && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`).MatchString(cur[0]) {
				cur = cur[1:]
			}
			if len(cur) > 0 {
				cmds = append(cmds, cur)
			}
			cur = nil
		}
		for _, w := range docWords(line) {
			switch {
			case w.op:
				flush()
			default:
				cur = append(cur, w.s)
			}
		}
		flush()
	}
	return cmds
}

// docWord is a word of a command line, or an operator (|, &&, ||, ;, a
// parenthesis).
type docWord struct {
	s  string
	op bool
}

// docWords splits a command line as sh would for the documented
// commands: words, 'single' and "double" quoted strings, operators, and
// a # comment.
func docWords(s string) []docWord {
	var words []docWord
	var w strings.Builder
	inWord := false
	var quote rune
	end := func() {
		if inWord {
			words = append(words, docWord{s: w.String()})
			w.Reset()
			inWord = false
		}
	}
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == '#' && !inWord:
			end()
			return words
		case r == ' ' || r == '\t':
			end()
		case r == '|' || r == '&' || r == ';' || r == '(' || r == ')':
			end()
			if i+1 < len(rs) && (r == '|' || r == '&') && rs[i+1] == r {
				i++
			}
			words = append(words, docWord{s: string(r), op: true})
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	end()
	return words
}

// TestDocLinks holds the links of README.md, CONTRIBUTING.md and
// docs/*.md to the repository: each names a file of it (and, after #, a
// heading of that file), never a page outside it.
func TestDocLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	var n int
	for _, f := range docFiles(t) {
		data, err := os.ReadFile(filepath.Join("../..", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(data), -1) {
			n++
			target, anchor, _ := strings.Cut(m[1], "#")
			if strings.Contains(target, ":") {
				t.Errorf("%s: a link outside the repository: %s", f, m[1])
				continue
			}
			path := filepath.Join("../..", filepath.Dir(f), target)
			if target == "" {
				path = filepath.Join("../..", f)
			}
			body, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("%s: link %s: %v", f, m[1], err)
				continue
			}
			if anchor != "" && !slices.Contains(anchors(string(body)), anchor) {
				t.Errorf("%s: link %s: no heading makes the anchor #%s", f, m[1], anchor)
			}
		}
	}
	if n < 30 {
		t.Errorf("found %d links in the documents, which hold more", n)
	}
}

// anchors returns the anchors of a Markdown file's headings, made as
// GitHub makes them: lower case, punctuation dropped, spaces as dashes.
func anchors(md string) []string {
	var out []string
	inCode := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimLeft(line, "# ")) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}

// TestDocPaths holds the repository paths that README.md,
// CONTRIBUTING.md, ARCHITECTURE.md, BENCHMARKS.md and docs/*.md name in
// code spans (`store/redisstore/decide.lua`) to files that exist: a
// figure or a design explained by a file that is gone explains nothing.
// A path counts when it begins with a top-level directory of the
// repository; CHANGELOG.md may name what was removed.
func TestDocPaths(t *testing.T) {
	span := regexp.MustCompile("`([A-Za-z0-9_./-]+/[A-Za-z0-9_.-]+\\.[a-z]+)`")
	var n int
	for _, f := range append([]string{"ARCHITECTURE.md", "BENCHMARKS.md"}, docFiles(t)...) {
		data, err := os.ReadFile(filepath.Join("../..", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range span.FindAllStringSubmatch(string(data), -1) {
			top, _, _ := strings.Cut(m[1], "/")
			if top == "" || top == "." || top == ".." {
				continue
			}
			if st, err := os.Stat(filepath.Join("../..", top)); err != nil || !st.IsDir() {
				continue
			}
			n++
			if _, err := os.Stat(filepath.Join("../..", m[1])); err != nil {
				t.Errorf("%s names %s, which does not exist", f, m[1])
			}
		}
	}
	if n < 20 {
		t.Errorf("found %d repository paths in the documents, which name more", n)
	}
}
