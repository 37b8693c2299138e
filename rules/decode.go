package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Both formats are first turned into the same plain values, then checked
// by one validator (checker): JSON and YAML files share every rule and
// every message. The plain values are: *object (keys in file order), []any,
// string, json.Number, float64 (a YAML .nan or .inf), bool and nil.

// object is a mapping that keeps its keys in file order, so that problems
// are reported in the order a reader meets them.
type object struct {
	keys []string
	vals map[string]any
}

func newObject() *object { return &object{vals: map[string]any{}} }

func (o *object) set(k string, v any) {
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

// decode reads data as JSON or YAML into plain values, with the line on
// which each value (by path) begins.
func decode(data []byte, name string) (any, map[string]int, []Issue) {
	if isYAML(data, name) {
		return decodeYAML(data)
	}
	return decodeJSON(data)
}

// withLines gives each problem without a line the line of its path, or of
// the nearest enclosing value that has one.
func withLines(problems []Issue, lines map[string]int) []Issue {
	for i, p := range problems {
		for path := p.Path; p.Line == 0; path = parent(path) {
			if l, ok := lines[path]; ok {
				problems[i].Line = l
				break
			}
			if path == "" {
				break
			}
		}
	}
	return problems
}

// parent is the path of the value that holds path's: rules[2].burst ->
// rules[2] -> rules -> "".
func parent(path string) string {
	if strings.HasSuffix(path, "\"]") { // match["a.b"]
		if i := strings.LastIndex(path, "[\""); i >= 0 {
			return path[:i]
		}
	}
	if strings.HasSuffix(path, "]") { // rules[2]
		if i := strings.LastIndexByte(path, '['); i >= 0 {
			return path[:i]
		}
	}
	if i := strings.LastIndexAny(path, ".]"); i >= 0 { // rules[2].name, a.b
		if path[i] == ']' {
			return path[:i+1]
		}
		return path[:i]
	}
	return ""
}

func isYAML(data []byte, name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".json":
		return false
	case ".yaml", ".yml":
		return true
	}
	t := bytes.TrimLeft(data, " \t\r\n\ufeff")
	return len(t) == 0 || (t[0] != '{' && t[0] != '[')
}

// decodeJSON reads JSON token by token, so that duplicate fields are
// reported (encoding/json keeps the last one silently).
func decodeJSON(data []byte) (any, map[string]int, []Issue) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	jd := &jsonReader{dec: dec, data: data, lines: map[string]int{}, line: 1}
	v, err := jd.value("", 0)
	if err == nil {
		if _, e := dec.Token(); e != io.EOF {
			err = fmt.Errorf("invalid JSON at %s: data after the top-level value", jd.pos(dec.InputOffset()))
		}
	}
	if err != nil {
		return nil, nil, []Issue{{Message: err.Error()}}
	}
	return v, jd.lines, jd.problems
}

type jsonReader struct {
	dec      *json.Decoder
	data     []byte
	problems []Issue
	lines    map[string]int // path -> line of the value
	off      int64          // lines counted up to here
	line     int            // the line at off
}

// lineAt is the line of offset off, which never decreases between calls.
func (r *jsonReader) lineAt(off int64) int {
	off = min(max(off, r.off), int64(len(r.data)))
	r.line += bytes.Count(r.data[r.off:off], []byte("\n"))
	r.off = off
	return r.line
}

func (r *jsonReader) pos(off int64) string {
	off = min(max(off, 0), int64(len(r.data)))
	line := 1 + bytes.Count(r.data[:off], []byte("\n"))
	col := off - int64(bytes.LastIndexByte(r.data[:off], '\n'))
	return fmt.Sprintf("line %d, column %d", line, col)
}

func (r *jsonReader) syntax(err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("invalid JSON at %s: %s", r.pos(se.Offset), se.Error())
	}
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		if len(bytes.TrimSpace(r.data)) == 0 {
			return errors.New("the file is empty")
		}
		return fmt.Errorf("invalid JSON at %s: unexpected end of input", r.pos(int64(len(r.data))))
	}
	return fmt.Errorf("invalid JSON at %s: %v", r.pos(r.dec.InputOffset()), err)
}

func (r *jsonReader) value(path string, depth int) (any, error) {
	if depth > maxNestingDepth {
		return nil, fmt.Errorf("invalid JSON at %s: nested more than %d deep", r.pos(r.dec.InputOffset()), maxNestingDepth)
	}
	t, err := r.dec.Token()
	if err != nil {
		return nil, r.syntax(err)
	}
	// The offset is just past the token, on the line it began on (a
	// JSON token holds no newline).
	r.lines[path] = r.lineAt(r.dec.InputOffset())
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := newObject()
			for r.dec.More() {
				kt, err := r.dec.Token()
				if err != nil {
					return nil, r.syntax(err)
				}
				k, _ := kt.(string)
				p := field(path, k)
				v, err := r.value(p, depth+1)
				if err != nil {
					return nil, err
				}
				if _, dup := o.vals[k]; dup {
					r.problems = append(r.problems, Issue{Path: p, Message: "duplicate field"})
					continue
				}
				o.set(k, v)
			}
			if _, err := r.dec.Token(); err != nil {
				return nil, r.syntax(err)
			}
			return o, nil
		case '[':
			l := []any{}
			for r.dec.More() {
				v, err := r.value(index(path, len(l)), depth+1)
				if err != nil {
					return nil, err
				}
				l = append(l, v)
			}
			if _, err := r.dec.Token(); err != nil {
				return nil, r.syntax(err)
			}
			return l, nil
		}
	}
	return t, nil // string, json.Number, bool or nil
}

// decodeYAML reads one YAML document into the same plain values as JSON.
func decodeYAML(data []byte) (v any, lines map[string]int, problems []Issue) {
	// The YAML parser is third-party code fed untrusted files: a panic in
	// it must be a bad file, not a crashed server (a reload keeps the old
	// rules).
	defer func() {
		if r := recover(); r != nil {
			v, lines, problems = nil, nil, []Issue{{Message: fmt.Sprintf("invalid YAML: %v", r)}}
		}
	}()
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return nil, nil, []Issue{{Message: "the file is empty"}}
		}
		return nil, nil, []Issue{yamlSyntax(data, err)}
	}
	var more yaml.Node
	if err := dec.Decode(&more); err != io.EOF {
		return nil, nil, []Issue{{Message: "invalid YAML: the file holds more than one document"}}
	}
	y := &yamlReader{lines: map[string]int{}}
	v = y.value("", &doc, 0)
	return v, y.lines, y.problems
}

// yamlParserProblems are the problems the YAML parser (not its scanner)
// reports. The parser gives their line counted from 0, and no line for
// the first: yamlSyntax counts it from 1 like every other line.
var yamlParserProblems = map[string]bool{
	"did not find expected ',' or ']'": true, "did not find expected ',' or '}'": true,
	"did not find expected '-' indicator": true, "did not find expected <document start>": true,
	"did not find expected <stream-start>": true, "did not find expected key": true,
	"did not find expected node content": true, "found duplicate %TAG directive": true,
	"found duplicate %YAML directive": true, "found incompatible YAML document": true,
	"found undefined tag handle": true,
}

var yamlLine = regexp.MustCompile(`^line (\d+): (.*)$`)

// yamlSyntax turns a YAML syntax error in data into a problem on the
// right line. A parser error names about the line where the construct it
// was parsing began (an unclosed [ or a block list), which is right for an
// unclosed bracket and wrong for a misindented key several lines below: so
// the problem is put on the first line from there at which the file, cut
// after that line, fails with the same message.
func yamlSyntax(data []byte, err error) Issue {
	msg, line := yamlError(err)
	if !yamlParserProblems[msg] {
		return Issue{Message: "invalid YAML: " + msg, Line: line}
	}
	// The parser counts this line from 0, and gives the line of the
	// problem instead when the construct began on the first line: start
	// the search at the line before the construct's.
	line = max(line, 1)
	lines := bytes.SplitAfter(data, []byte("\n"))
	if line > len(lines) {
		return Issue{Message: "invalid YAML: " + msg, Line: line}
	}
	prefix := bytes.Join(lines[:line-1], nil)
	for l := line; l <= len(lines) && l < line+maxYAMLSearch; l++ {
		prefix = append(prefix, lines[l-1]...)
		var n yaml.Node
		if err := yaml.Unmarshal(prefix, &n); err != nil {
			if m, _ := yamlError(err); m == msg {
				return Issue{Message: "invalid YAML: " + msg, Line: l}
			}
		}
	}
	return Issue{Message: "invalid YAML: " + msg, Line: line}
}

// maxYAMLSearch bounds the lines yamlSyntax tries.
const maxYAMLSearch = 200

// yamlError splits a YAML error into its message and the line it gives (0
// when none).
func yamlError(err error) (msg string, line int) {
	msg = strings.TrimPrefix(err.Error(), "yaml: ")
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	return msg, line
}

type yamlReader struct {
	lines    map[string]int // path -> line of the value
	nodes    int
	tooBig   bool
	active   map[*yaml.Node]bool // the nodes being read: an alias to one is a cycle
	problems []Issue
}

func (y *yamlReader) enter(n *yaml.Node) {
	if y.active == nil {
		y.active = map[*yaml.Node]bool{}
	}
	y.active[n] = true
}

func (y *yamlReader) leave(n *yaml.Node) { delete(y.active, n) }

func (y *yamlReader) add(path, msg string) { y.addAt(path, 0, msg) }

func (y *yamlReader) addAt(path string, line int, msg string) {
	y.problems = append(y.problems, Issue{Path: path, Message: msg, Line: line})
}

func (y *yamlReader) value(path string, n *yaml.Node, depth int) any {
	if _, ok := y.lines[path]; !ok && n.Line > 0 {
		y.lines[path] = n.Line // an alias: where it is used, not its anchor
	}
	y.nodes++
	if depth > maxNestingDepth || y.nodes > maxYAMLNodes {
		if !y.tooBig {
			y.tooBig = true
			y.add(path, "the document is too large or too deeply nested")
		}
		return nil
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil
		}
		return y.value(path, n.Content[0], depth)
	case yaml.AliasNode:
		if y.active[n.Alias] {
			y.addAt(path, n.Line, fmt.Sprintf("alias *%s refers to a node that contains it", n.Value))
			return nil
		}
		return y.value(path, n.Alias, depth+1)
	case yaml.SequenceNode:
		y.enter(n)
		defer y.leave(n)
		l := make([]any, 0, len(n.Content))
		for i, c := range n.Content {
			l = append(l, y.value(index(path, i), c, depth+1))
		}
		return l
	case yaml.MappingNode:
		o := newObject()
		y.mapping(path, n, o, depth)
		return o
	case yaml.ScalarNode:
		return y.scalar(path, n)
	}
	y.add(path, "unsupported YAML node")
	return nil
}

func (y *yamlReader) mapping(path string, n *yaml.Node, o *object, depth int) {
	// Merges recurse here without passing through value: bound them too
	// (a mapping may merge itself: &a {<<: *a}).
	y.nodes++
	if depth > maxNestingDepth || y.nodes > maxYAMLNodes {
		if !y.tooBig {
			y.tooBig = true
			y.add(path, "the document is too large or too deeply nested")
		}
		return
	}
	y.enter(n)
	defer y.leave(n)
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		if kn.Kind == yaml.ScalarNode && kn.Tag == "!!merge" {
			merges = append(merges, vn)
			continue
		}
		if kn.Kind != yaml.ScalarNode {
			y.addAt(path, kn.Line, "a key must be a plain string")
			continue
		}
		k := kn.Value
		p := field(path, k)
		if _, dup := o.vals[k]; dup {
			y.addAt(p, kn.Line, "duplicate field")
			continue
		}
		o.set(k, y.value(p, vn, depth+1))
	}
	// Merge keys (<<: *base) fill in what the mapping does not set itself.
	for _, m := range merges {
		src := m
		if src.Kind == yaml.AliasNode {
			src = src.Alias
		}
		var list []*yaml.Node
		switch src.Kind {
		case yaml.MappingNode:
			list = []*yaml.Node{src}
		case yaml.SequenceNode:
			for _, c := range src.Content {
				if c.Kind == yaml.AliasNode {
					c = c.Alias
				}
				list = append(list, c)
			}
		}
		for _, mn := range list {
			if y.active[mn] {
				y.addAt(path, m.Line, "a merge (<<) refers to a mapping that contains it")
				continue
			}
			if mn.Kind != yaml.MappingNode {
				y.add(path, "a merge (<<) must name a mapping")
				continue
			}
			sub := newObject()
			y.mapping(path, mn, sub, depth+1)
			for _, k := range sub.keys {
				if _, ok := o.vals[k]; !ok {
					o.set(k, sub.vals[k])
				}
			}
		}
	}
}

func (y *yamlReader) scalar(path string, n *yaml.Node) any {
	switch n.ShortTag() {
	case "!!null":
		return nil
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err != nil {
			y.add(path, err.Error())
		}
		return b
	case "!!int":
		var i int64
		if err := n.Decode(&i); err != nil {
			var f float64
			if err := n.Decode(&f); err != nil {
				y.add(path, fmt.Sprintf("%q is not a usable number", n.Value))
				return nil
			}
			return json.Number(strconv.FormatFloat(f, 'g', -1, 64))
		}
		return json.Number(strconv.FormatInt(i, 10))
	case "!!float":
		var f float64
		if err := n.Decode(&f); err != nil {
			y.add(path, fmt.Sprintf("%q is not a usable number", n.Value))
			return nil
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return f
		}
		return json.Number(strconv.FormatFloat(f, 'g', -1, 64))
	}
	return n.Value // !!str, !!timestamp, !!binary and custom tags read as text
}

// field and index build paths: rules[2].algorithm_config.burst. Keys that
// are not plain words are quoted: match["jwt:plan"] reads better as
// match.jwt:plan, so only keys with dots, brackets, quotes or spaces are.
func field(path, k string) string {
	if k == "" || strings.ContainsAny(k, ".[]\" \t\n") {
		k = "[" + strconv.Quote(k) + "]"
		return path + k
	}
	if path == "" {
		return k
	}
	return path + "." + k
}

func index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }
