package xds

import (
	"fmt"
	"strconv"
	"strings"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/driplimit/drip/server/envoy"
)

// MaxDepth bounds how deep a resource's descriptors nest.
const MaxDepth = 32

// Files turns RateLimitConfig resources into envoyproxy/ratelimit config
// files, one each, named "xds:<resource name>", so that they are parsed
// and checked exactly as files are (envoy.ParseWith): the same fields,
// the same errors. A unit the resource leaves unset (UNKNOWN) on a limit
// that is not unlimited is written as "unknown", which the parser
// refuses.
//
// The files are built as the YAML nodes the parser reads (envoy.File's
// Doc), never written out: in time and memory proportional to the
// resources. (yaml.Marshal keeps every event of a document until its
// end: a snapshot of 170,000 descriptors took gigabytes to write.)
func Files(cfgs []*rlconfv3.RateLimitConfig) ([]envoy.File, error) {
	files := make([]envoy.File, 0, len(cfgs))
	var b builder
	for i, c := range cfgs {
		descs, err := b.descriptors(c.GetDescriptors(), 1)
		if err != nil {
			return nil, fmt.Errorf("resources[%d] (%q): %w", i, c.GetName(), err)
		}
		root := b.mapping("domain", str(c.GetDomain()))
		if descs != nil {
			b.add(root, "descriptors", descs)
		}
		doc := &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root}}
		files = append(files, envoy.File{Name: "xds:" + c.GetName(), Doc: doc})
	}
	return files, nil
}

// builder makes the nodes of Files; the nodes of mapping keys are shared,
// since the parser only reads them.
type builder struct {
	keys map[string]*yaml.Node
}

func (b *builder) key(k string) *yaml.Node {
	n, ok := b.keys[k]
	if !ok {
		if b.keys == nil {
			b.keys = map[string]*yaml.Node{}
		}
		n = str(k)
		b.keys[k] = n
	}
	return n
}

// mapping is a mapping node of key, value, ... pairs.
func (b *builder) mapping(kv ...any) *yaml.Node {
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for i := 0; i+1 < len(kv); i += 2 {
		b.add(m, kv[i].(string), kv[i+1].(*yaml.Node))
	}
	return m
}

func (b *builder) add(m *yaml.Node, k string, v *yaml.Node) {
	m.Content = append(m.Content, b.key(k), v)
}

func scalar(tag, v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v} }
func str(s string) *yaml.Node         { return scalar("!!str", s) }

var yes = scalar("!!bool", "true")

func (b *builder) descriptors(ds []*rlconfv3.RateLimitDescriptor, depth int) (*yaml.Node, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	if depth > MaxDepth {
		return nil, fmt.Errorf("descriptors nest deeper than %d levels", MaxDepth)
	}
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: make([]*yaml.Node, 0, len(ds))}
	for _, d := range ds {
		sub, err := b.descriptors(d.GetDescriptors(), depth+1)
		if err != nil {
			return nil, err
		}
		m := b.mapping("key", str(d.GetKey()))
		if v := d.GetValue(); v != "" {
			b.add(m, "value", str(v))
		}
		if p := d.GetRateLimit(); p != nil {
			rl := b.mapping()
			if p.GetUnlimited() {
				b.add(rl, "unlimited", yes)
			} else {
				b.add(rl, "unit", str(strings.ToLower(p.GetUnit().String())))
				b.add(rl, "requests_per_unit", scalar("!!int", strconv.FormatUint(uint64(p.GetRequestsPerUnit()), 10)))
			}
			if name := p.GetName(); name != "" {
				b.add(rl, "name", str(name))
			}
			if rs := p.GetReplaces(); len(rs) > 0 {
				list := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
				for _, r := range rs {
					list.Content = append(list.Content, b.mapping("name", str(r.GetName())))
				}
				b.add(rl, "replaces", list)
			}
			b.add(m, "rate_limit", rl)
		}
		if sub != nil {
			b.add(m, "descriptors", sub)
		}
		if d.GetShadowMode() {
			b.add(m, "shadow_mode", yes)
		}
		if d.GetDetailedMetric() {
			b.add(m, "detailed_metric", yes)
		}
		seq.Content = append(seq.Content, m)
	}
	return seq, nil
}
