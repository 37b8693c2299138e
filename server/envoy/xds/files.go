package xds

import (
	"encoding/json"
	"fmt"
	"strings"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

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
// The files are JSON (which is YAML), one field a line: encoding/json
// writes in time proportional to the resource, where the YAML encoder
// keeps every event of a document until its end (a snapshot of 170,000
// descriptors took seconds and hundreds of megabytes to write).
func Files(cfgs []*rlconfv3.RateLimitConfig) ([]envoy.File, error) {
	files := make([]envoy.File, 0, len(cfgs))
	for i, c := range cfgs {
		descs, err := descriptors(c.GetDescriptors(), 1)
		if err != nil {
			return nil, fmt.Errorf("resources[%d] (%q): %w", i, c.GetName(), err)
		}
		data, err := json.MarshalIndent(fileConfig{Domain: c.GetDomain(), Descriptors: descs}, "", " ")
		if err != nil {
			return nil, fmt.Errorf("resources[%d] (%q): %w", i, c.GetName(), err)
		}
		files = append(files, envoy.File{Name: "xds:" + c.GetName(), Data: data})
	}
	return files, nil
}

type fileConfig struct {
	Domain      string           `json:"domain"`
	Descriptors []fileDescriptor `json:"descriptors,omitempty"`
}

type fileDescriptor struct {
	Key            string           `json:"key"`
	Value          string           `json:"value,omitempty"`
	RateLimit      *fileRateLimit   `json:"rate_limit,omitempty"`
	Descriptors    []fileDescriptor `json:"descriptors,omitempty"`
	ShadowMode     bool             `json:"shadow_mode,omitempty"`
	DetailedMetric bool             `json:"detailed_metric,omitempty"`
}

type fileRateLimit struct {
	Unit            string        `json:"unit,omitempty"`
	RequestsPerUnit *uint32       `json:"requests_per_unit,omitempty"`
	Unlimited       bool          `json:"unlimited,omitempty"`
	Name            string        `json:"name,omitempty"`
	Replaces        []fileReplace `json:"replaces,omitempty"`
}

type fileReplace struct {
	Name string `json:"name"`
}

func descriptors(ds []*rlconfv3.RateLimitDescriptor, depth int) ([]fileDescriptor, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	if depth > MaxDepth {
		return nil, fmt.Errorf("descriptors nest deeper than %d levels", MaxDepth)
	}
	out := make([]fileDescriptor, len(ds))
	for i, d := range ds {
		sub, err := descriptors(d.GetDescriptors(), depth+1)
		if err != nil {
			return nil, err
		}
		out[i] = fileDescriptor{Key: d.GetKey(), Value: d.GetValue(), Descriptors: sub,
			ShadowMode: d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric()}
		if p := d.GetRateLimit(); p != nil {
			rl := &fileRateLimit{Unlimited: p.GetUnlimited(), Name: p.GetName()}
			if !p.GetUnlimited() {
				rl.Unit = strings.ToLower(p.GetUnit().String())
				n := p.GetRequestsPerUnit()
				rl.RequestsPerUnit = &n
			}
			for _, r := range p.GetReplaces() {
				rl.Replaces = append(rl.Replaces, fileReplace{Name: r.GetName()})
			}
			out[i].RateLimit = rl
		}
	}
	return out, nil
}
