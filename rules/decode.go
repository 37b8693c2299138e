package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
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

// decode reads data as JSON or YAML into plain values.
func decode(data []byte, name string) (any, []Problem) {
	if isYAML(data, name) {
		return decodeYAML(data)
	}
	return decodeJSON(data)
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
func decodeJSON(data []byte) (any, []Problem) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	jd := &jsonReader{dec: dec, data: data}
	v, err := jd.value("", 0)
	if err == nil {
		if _, e := dec.Token(); e != io.EOF {
			err = fmt.Errorf("invalid JSON at %s: data after the top-level value", jd.pos(dec.InputOffset()))
		}
	}
	if err != nil {
		return nil, []Problem{{Message: err.Error()}}
	}
	return v, jd.problems
}

type jsonReader struct {
	dec      *json.Decoder
	data     []byte
	problems []Problem
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
					r.problems = append(r.problems, Problem{p, "duplicate field"})
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
func decodeYAML(data []byte) (v any, problems []Problem) {
	// The YAML parser is third-party code fed untrusted files: a panic in
	// it must be a bad file, not a crashed server (a reload keeps the old
	// rules).
	defer func() {
		if r := recover(); r != nil {
			v, problems = nil, []Problem{{Message: fmt.Sprintf("invalid YAML: %v", r)}}
		}
	}()
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return nil, []Problem{{Message: "the file is empty"}}
		}
		return nil, []Problem{{Message: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}}
	}
	var more yaml.Node
	if err := dec.Decode(&more); err != io.EOF {
		return nil, []Problem{{Message: "invalid YAML: the file holds more than one document"}}
	}
	y := &yamlReader{}
	v = y.value("", &doc, 0)
	return v, y.problems
}

type yamlReader struct {
	nodes    int
	tooBig   bool
	active   map[*yaml.Node]bool // the nodes being read: an alias to one is a cycle
	problems []Problem
}

func (y *yamlReader) enter(n *yaml.Node) {
	if y.active == nil {
		y.active = map[*yaml.Node]bool{}
	}
	y.active[n] = true
}

func (y *yamlReader) leave(n *yaml.Node) { delete(y.active, n) }

func (y *yamlReader) add(path, msg string) { y.problems = append(y.problems, Problem{path, msg}) }

func (y *yamlReader) value(path string, n *yaml.Node, depth int) any {
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
			y.add(path, fmt.Sprintf("line %d: alias *%s refers to a node that contains it", n.Line, n.Value))
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
			y.add(path, fmt.Sprintf("line %d: a key must be a plain string", kn.Line))
			continue
		}
		k := kn.Value
		p := field(path, k)
		if _, dup := o.vals[k]; dup {
			y.add(p, "duplicate field")
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
				y.add(path, fmt.Sprintf("line %d: a merge (<<) refers to a mapping that contains it", m.Line))
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
