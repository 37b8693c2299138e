package xds

import (
	"fmt"
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
func Files(cfgs []*rlconfv3.RateLimitConfig) ([]envoy.File, error) {
	files := make([]envoy.File, 0, len(cfgs))
	for i, c := range cfgs {
		descs, err := descriptors(c.GetDescriptors(), 1)
		if err != nil {
			return nil, fmt.Errorf("resources[%d] (%q): %w", i, c.GetName(), err)
		}
		data, err := yaml.Marshal(yamlConfig{Domain: c.GetDomain(), Descriptors: descs})
		if err != nil {
			return nil, fmt.Errorf("resources[%d] (%q): %w", i, c.GetName(), err)
		}
		files = append(files, envoy.File{Name: "xds:" + c.GetName(), Data: data})
	}
	return files, nil
}

type yamlConfig struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value,omitempty"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit,omitempty"`
	Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
	ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
	DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
}

type yamlRateLimit struct {
	Unit            string        `yaml:"unit,omitempty"`
	RequestsPerUnit *uint32       `yaml:"requests_per_unit,omitempty"`
	Unlimited       bool          `yaml:"unlimited,omitempty"`
	Name            string        `yaml:"name,omitempty"`
	Replaces        []yamlReplace `yaml:"replaces,omitempty"`
}

type yamlReplace struct {
	Name string `yaml:"name"`
}

func descriptors(ds []*rlconfv3.RateLimitDescriptor, depth int) ([]yamlDescriptor, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	if depth > MaxDepth {
		return nil, fmt.Errorf("descriptors nest deeper than %d levels", MaxDepth)
	}
	out := make([]yamlDescriptor, len(ds))
	for i, d := range ds {
		sub, err := descriptors(d.GetDescriptors(), depth+1)
		if err != nil {
			return nil, err
		}
		out[i] = yamlDescriptor{Key: d.GetKey(), Value: d.GetValue(), Descriptors: sub,
			ShadowMode: d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric()}
		if p := d.GetRateLimit(); p != nil {
			rl := &yamlRateLimit{Unlimited: p.GetUnlimited(), Name: p.GetName()}
			if !p.GetUnlimited() {
				rl.Unit = strings.ToLower(p.GetUnit().String())
				n := p.GetRequestsPerUnit()
				rl.RequestsPerUnit = &n
			}
			for _, r := range p.GetReplaces() {
				rl.Replaces = append(rl.Replaces, yamlReplace{Name: r.GetName()})
			}
			out[i].RateLimit = rl
		}
	}
	return out, nil
}
