package envoy

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/store/memstore"
)

// TestHeadersAreStructuredFields parses every header of
// response_headers_to_add with a strict structured-field parser: limit
// names outside printable ASCII (a descriptor value, a rate_limit.name
// with a quote) and a fractional burst still make valid fields.
func TestHeadersAreStructuredFields(t *testing.T) {
	c, err := Parse(File{Name: "sf.yaml", Data: []byte(`domain: sf
descriptors:
  - key: city
    value: café
    rate_limit: {unit: second, requests_per_unit: 2, burst: 2.3333333}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: "naïve \"q\" 50%"}
`)})
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, memstore.New(), c, false)
	get := func(h []*corev3.HeaderValue) func(string) string {
		return func(name string) string {
			for _, v := range h {
				if v.Key == name {
					return v.Value
				}
			}
			return ""
		}
	}
	denied := false
	for i := range 4 {
		resp := r.call(t, "sf", 0, desc("city=café"), desc("user=u"))
		h := get(resp.ResponseHeadersToAdd)
		if h("RateLimit") == "" {
			t.Fatalf("call %d: no headers: %v", i, resp)
		}
		if err := sfv.CheckHeaders(h); err != nil {
			t.Errorf("call %d: %v", i, err)
		}
		list, _ := sfv.ParseList(h("RateLimit"))
		var names []string
		for _, it := range list {
			n, err := sfv.Unescape(it.Value.(string))
			if err != nil {
				t.Error(err)
			}
			names = append(names, n)
		}
		if len(names) != 2 || names[0] != "sf.city_café" || names[1] != `naïve "q" 50%` {
			t.Errorf("call %d: names %q", i, names)
		}
		denied = denied || resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if !denied {
		t.Error("no call was denied: the headers of a denial went unchecked")
	}
}
