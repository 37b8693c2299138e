package envoy

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/rules"
)

// parser decodes one file strictly, collecting every problem.
type parser struct {
	file     string
	shadow   bool           // every limit in shadow mode (SHADOW_MODE)
	algo     drip.Algorithm // of limits without "algorithm" (Options.Algorithm)
	leased   bool           // of limits without "leased" (Options.Leased)
	problems []rules.Issue
}

func (p *parser) add(path, format string, args ...any) { p.addAt(nil, path, format, args...) }

// addAt reports a problem at node n (for its line; nil when unknown) and
// path.
func (p *parser) addAt(n *yaml.Node, path, format string, args ...any) {
	is := rules.Issue{File: p.file, Path: path, Message: fmt.Sprintf(format, args...)}
	if n != nil && n.Line > 0 {
		is.Line = n.Line
	}
	p.problems = append(p.problems, is)
}

// fields walks a mapping node: known keys to their values, unknown keys
// reported.
func (p *parser) fields(n *yaml.Node, path string, known ...string) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	if n.Kind != yaml.MappingNode {
		p.addAt(n, path, "must be a mapping")
		return out
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		kp := join(path, k.Value)
		if !slices.Contains(known, k.Value) {
			p.addAt(k, kp, "unknown key (want one of %s)", strings.Join(known, ", "))
			continue
		}
		if _, dup := out[k.Value]; dup {
			p.addAt(k, kp, "repeated key")
			continue
		}
		out[k.Value] = v
	}
	return out
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (p *parser) str(n *yaml.Node, path string) (string, bool) {
	if n == nil || n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.addAt(n, path, "must be a string")
		return "", false
	}
	return n.Value, true
}

func (p *parser) boolean(n *yaml.Node, path string) bool {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		p.addAt(n, path, "must be true or false")
		return false
	}
	return b
}

// parse decodes a file into its domain and descriptor list (nil when
// there is none); a domain of "" is a file that cannot be loaded.
func (p *parser) parse(file File) (string, *yaml.Node) {
	doc := file.Doc
	if doc == nil {
		doc = new(yaml.Node)
		dec := yaml.NewDecoder(bytes.NewReader(file.Data))
		if err := dec.Decode(doc); err != nil {
			p.add("", "not valid YAML: %v", err)
			return "", nil
		}
		var extra yaml.Node
		if err := dec.Decode(&extra); err == nil {
			p.add("", "holds more than one YAML document")
		}
	}
	if len(doc.Content) == 0 {
		p.add("", "empty file")
		return "", nil
	}
	f := p.fields(doc.Content[0], "", "domain", "descriptors")
	domain := ""
	if v, ok := f["domain"]; !ok {
		p.add("domain", "config file cannot have empty domain")
	} else if d, ok := p.str(v, "domain"); ok {
		if d == "" {
			p.addAt(v, "domain", "config file cannot have empty domain")
		}
		domain = d
	}
	if v, ok := f["descriptors"]; ok && !(v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
		return domain, v
	}
	return domain, nil
}

var descriptorKeys = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata"}
var rateLimitKeys = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "burst", "algorithm", "leased", "settle"}

// descriptors loads a descriptor list into parent.
func (p *parser) descriptors(parent *node, n *yaml.Node, path, parentKey string) {
	if n.Kind != yaml.SequenceNode {
		p.addAt(n, path, "must be a list of descriptors")
		return
	}
	for i, dn := range n.Content {
		dp := path + "[" + strconv.Itoa(i) + "]"
		f := p.fields(dn, dp, descriptorKeys...)
		key, value := "", ""
		if v, ok := f["key"]; !ok {
			p.addAt(dn, dp+".key", "descriptor has empty key")
			continue
		} else if k, ok := p.str(v, dp+".key"); !ok {
			continue
		} else if k == "" {
			p.addAt(v, dp+".key", "descriptor has empty key")
			continue
		} else {
			key = k
		}
		if v, ok := f["value"]; ok {
			if s, ok := p.str(v, dp+".value"); ok {
				value = s
			}
		}
		finalKey := key
		if value != "" {
			finalKey += "_" + value
		}
		full := parentKey + finalKey
		if _, dup := parent.children[finalKey]; dup {
			p.addAt(dn, dp, "duplicate descriptor composite key '%s'", full)
			continue
		}
		child := &node{children: map[string]*node{}}
		own, quota := false, false
		if v, ok := f["shadow_mode"]; ok && p.boolean(v, dp+".shadow_mode") {
			own = true
		}
		if v, ok := f["quota_mode"]; ok {
			quota = p.boolean(v, dp+".quota_mode")
		}
		for _, k := range []string{"detailed_metric", "value_to_metric"} {
			if v, ok := f[k]; ok {
				p.boolean(v, dp+"."+k) // stats only: accepted, no effect on limits
			}
		}
		var meta *structpb.Struct
		if v, ok := f["metadata"]; ok {
			meta = p.metadata(v, dp+".metadata")
		}
		wildcard := strings.Contains(finalKey, "*")
		if v, ok := f["share_threshold"]; ok && p.boolean(v, dp+".share_threshold") {
			switch {
			case !wildcard:
				p.addAt(v, dp+".share_threshold", "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", finalKey)
			case value != "":
				child.share = value
			default: // a wildcard key without a value
				child.share = finalKey
			}
		}
		if v, ok := f["rate_limit"]; ok {
			if l := p.rateLimit(v, dp+".rate_limit", full, own || p.shadow); l != nil {
				l.Quota, l.Metadata, l.globalShadow = quota, meta, p.shadow && !own
				child.limit = l
			}
		}
		if v, ok := f["descriptors"]; ok {
			p.descriptors(child, v, dp+".descriptors", full+".")
		}
		if wildcard {
			parent.wildcards = append(parent.wildcards, newWildcard(finalKey))
		}
		parent.children[finalKey] = child
	}
}

// rateLimit loads a rate_limit block.
func (p *parser) rateLimit(n *yaml.Node, path, full string, shadow bool) *Limit {
	f := p.fields(n, path, rateLimitKeys...)
	l := &Limit{Path: full, Shadow: shadow, UnitMultiplier: 1}
	ok := true
	if v, has := f["unlimited"]; has {
		l.Unlimited = p.boolean(v, path+".unlimited")
	}
	if v, has := f["name"]; has {
		l.Name, _ = p.str(v, path+".name")
	}
	if v, has := f["replaces"]; has {
		if v.Kind != yaml.SequenceNode {
			p.addAt(v, path+".replaces", "must be a list of {name: ...}")
			ok = false
		} else {
			for i, rn := range v.Content {
				rp := path + ".replaces[" + strconv.Itoa(i) + "]"
				rf := p.fields(rn, rp, "name")
				name := ""
				if nv, has := rf["name"]; has {
					name, _ = p.str(nv, rp+".name")
				}
				switch {
				case name == "":
					p.addAt(rn, rp, "should not have an empty replaces entry")
					ok = false
				case name == l.Name:
					p.addAt(rn, rp, "replaces should not contain name of same descriptor")
					ok = false
				default:
					l.Replaces = append(l.Replaces, name)
				}
			}
		}
	}
	unit, hasUnit := f["unit"]
	if hasUnit {
		s, _ := p.str(unit, path+".unit")
		u, valid := rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(s)]
		switch {
		case l.Unlimited && valid && u != 0:
			p.addAt(unit, path+".unit", "should not specify rate limit unit when unlimited")
			ok = false
		case !l.Unlimited && (!valid || u == 0):
			p.addAt(unit, path+".unit", "invalid rate limit unit '%s' (want second, minute, hour, day, week, month or year)", s)
			ok = false
		default:
			l.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(u)
		}
	} else if !l.Unlimited {
		p.addAt(n, path+".unit", "invalid rate limit unit '' (want second, minute, hour, day, week, month or year)")
		ok = false
	}
	if v, has := f["requests_per_unit"]; has {
		var rpu uint32
		if v.Kind != yaml.ScalarNode || v.Decode(&rpu) != nil {
			p.addAt(v, path+".requests_per_unit", "must be a whole number from 0 to 4294967295, not %q", v.Value)
			ok = false
		}
		l.RequestsPerUnit = rpu
	}
	var burst float64
	if v, has := f["burst"]; has {
		if v.Kind != yaml.ScalarNode || v.Decode(&burst) != nil || !(burst > 0) || math.IsInf(burst, 0) {
			p.addAt(v, path+".burst", "must be a number > 0, not %q", v.Value)
			ok = false
		} else if l.Unlimited || l.RequestsPerUnit == 0 {
			p.addAt(v, path+".burst", "needs a limit of requests_per_unit > 0")
			ok = false
		}
	}
	if v, has := f["settle"]; has {
		l.Settle = p.boolean(v, path+".settle")
		if l.Settle && (l.Unlimited || l.RequestsPerUnit == 0) {
			p.addAt(v, path+".settle", "needs a limit of requests_per_unit > 0")
			ok = false
		}
	}
	algo := p.algo
	if v, has := f["algorithm"]; has {
		s, _ := p.str(v, path+".algorithm")
		switch drip.Algorithm(s) {
		case drip.TokenBucket:
			algo = ""
		case drip.FixedWindow:
			algo = drip.FixedWindow
		default:
			p.addAt(v, path+".algorithm", "must be token_bucket or fixed_window, not %q", s)
			ok = false
		}
	}
	leased := p.leased
	if v, has := f["leased"]; has {
		leased = p.boolean(v, path+".leased")
		if leased && (l.Unlimited || l.RequestsPerUnit == 0) {
			p.addAt(v, path+".leased", "needs a limit of requests_per_unit > 0")
			ok = false
		}
	}
	if !ok {
		return nil
	}
	if err := newLimit(l, burst, algo, leased); err != nil {
		p.addAt(n, path, "%s", strings.TrimPrefix(err.Error(), drip.ErrInvalidLimit.Error()+": "))
		return nil
	}
	return l
}

// errUnit is the error of a request override with no known unit.
var errUnit = errors.New("unknown unit")

// maxMetadata bounds the values of one descriptor's metadata, so that
// YAML aliases cannot expand it without end.
const maxMetadata = 10000

// metadata converts a descriptor's metadata (any mapping) to a protobuf
// Struct, as envoyproxy/ratelimit keeps it: mapping keys as strings,
// booleans, numbers and null as themselves, other scalars as strings.
func (p *parser) metadata(n *yaml.Node, path string) *structpb.Struct {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.addAt(n, path, "must be a mapping")
		return nil
	}
	budget := maxMetadata
	v, err := metadataValue(n, &budget)
	if err != nil {
		p.addAt(n, path, "%v", err)
		return nil
	}
	if s := v.GetStructValue(); len(s.GetFields()) > 0 {
		return s
	}
	return nil
}

func metadataValue(n *yaml.Node, budget *int) (*structpb.Value, error) {
	if *budget--; *budget < 0 {
		return nil, fmt.Errorf("more than %d values", maxMetadata)
	}
	switch n.Kind {
	case yaml.AliasNode:
		return metadataValue(n.Alias, budget)
	case yaml.MappingNode:
		s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(n.Content)/2)}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind == yaml.AliasNode {
				k = k.Alias
			}
			if k.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: a key must be a scalar", k.Line)
			}
			v, err := metadataValue(n.Content[i+1], budget)
			if err != nil {
				return nil, err
			}
			s.Fields[k.Value] = v
		}
		return structpb.NewStructValue(s), nil
	case yaml.SequenceNode:
		l := &structpb.ListValue{Values: make([]*structpb.Value, len(n.Content))}
		for i, c := range n.Content {
			v, err := metadataValue(c, budget)
			if err != nil {
				return nil, err
			}
			l.Values[i] = v
		}
		return structpb.NewListValue(l), nil
	}
	switch n.Tag {
	case "!!null":
		return structpb.NewNullValue(), nil
	case "!!bool":
		var b bool
		if n.Decode(&b) == nil {
			return structpb.NewBoolValue(b), nil
		}
	case "!!int", "!!float":
		var f float64
		if n.Decode(&f) == nil {
			return structpb.NewNumberValue(f), nil
		}
	}
	return structpb.NewStringValue(n.Value), nil
}
