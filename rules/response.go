package rules

import (
	"net/textproto"
	"strconv"
	"strings"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/llm"
)

// Rules that know the response: cost_from_response (the cost is settled
// when the response ends) and count_status (only responses whose status
// matches are counted).

// ResponseSource names the value of a response that a rule's cost is
// read from (cost_from_response). "header:<name>" is a response header,
// or gRPC header metadata. "trailer:<name>" is an HTTP trailer, or gRPC
// trailer metadata. Name is in canonical form (X-Usage-Tokens); gRPC
// doors read it in lower case.
//
// API ("openai" or "anthropic") reads the usage a model server reports
// in its body: a JSON body's "usage", or the server-sent events that
// carry it. The cost is the call's tokens (docs/llm.md). Trailer and Name
// are then unset. Only HTTP doors read a body.
type ResponseSource struct {
	Trailer bool
	Name    string
	API     string
	// Prices is the file's price table, for a usage that is priced
	// ("openai:money").
	Prices *llm.Prices
}

// String returns the source as written in a rules file.
func (s ResponseSource) String() string {
	if s.API != "" {
		return s.API
	}
	if s.Trailer {
		return "trailer:" + strings.ToLower(s.Name)
	}
	return "header:" + strings.ToLower(s.Name)
}

// ParseResponseSource reads a cost_from_response value.
func ParseResponseSource(s string) (ResponseSource, bool) {
	if _, _, ok := llm.ParseName(s); ok {
		return ResponseSource{API: s}, true
	}
	kind, name, ok := strings.Cut(s, ":")
	if !ok || !isToken(name) || (kind != "header" && kind != "trailer") {
		return ResponseSource{}, false
	}
	return ResponseSource{Trailer: kind == "trailer", Name: textproto.CanonicalMIMEHeaderKey(name)}, true
}

// StatusSet is the statuses a count_status rule counts: ranges of HTTP
// status codes, each a code (401) or a class ("4xx", 400 to 499).
type StatusSet []StatusRange

// StatusRange is the codes from Lo to Hi, both included.
type StatusRange struct{ Lo, Hi int }

// Has reports whether code is in the set.
func (s StatusSet) Has(code int) bool {
	for _, r := range s {
		if r.Lo <= code && code <= r.Hi {
			return true
		}
	}
	return false
}

// Settles reports whether the rule is decided again when the response
// ends (cost_from_response or count_status).
func (r *Rule) Settles() bool { return r.CostFrom != nil || len(r.CountStatus) > 0 }

// costFromResponse reads a rule's cost_from_response.
func (c *checker) costFromResponse(p string, v any) *ResponseSource {
	s, ok := c.str(p, v)
	if !ok {
		return nil
	}
	src, ok := ParseResponseSource(s)
	if !ok {
		c.add(p, "%q is not a response source (header:<name>, trailer:<name>, openai or anthropic, with :input or :output for a part or :money for its price)", s)
		return nil
	}
	return &src
}

// countStatus reads a rule's count_status: a status class ("4xx"), a
// code (401), or a list of them.
func (c *checker) countStatus(p string, v any) StatusSet {
	vals, isList := v.([]any)
	if !isList {
		vals = []any{v}
	} else if len(vals) == 0 {
		c.add(p, "must not be an empty list")
		return nil
	}
	var out StatusSet
	for i, x := range vals {
		xp := p
		if isList {
			xp = index(p, i)
		}
		text, ok := scalarText(x)
		if !ok {
			c.add(xp, "must be a status code (401) or class (\"4xx\"), not %s", kindOf(x))
			continue
		}
		if len(text) == 3 && text[1:] == "xx" && '1' <= text[0] && text[0] <= '5' {
			lo := int(text[0]-'0') * 100
			out = append(out, StatusRange{lo, lo + 99})
			continue
		}
		n, err := strconv.Atoi(text)
		if err != nil || n < 100 || n > 599 {
			c.add(xp, "%q is not a status code from 100 to 599 or a class from \"1xx\" to \"5xx\"", text)
			continue
		}
		out = append(out, StatusRange{n, n})
	}
	return out
}

// settleRule checks what a rule that settles after the response may not
// combine with.
func (c *checker) settleRule(p string, r *Rule) {
	if r.Budget == Strict {
		api := r.CostSource.Name
		switch {
		case r.CostSource.Kind != KindBound:
			c.add(p+".budget", "a strict budget takes the most a call can cost: set algorithm_config.cost_source to openai or anthropic (or a part of one, openai:output)")
		case r.CostFrom == nil || r.CostFrom.API != api:
			c.add(p+".budget", "a strict budget refunds what the response reports: set cost_from_response to %s", api)
		}
	}
	if !r.Settles() {
		return
	}
	what := "cost_from_response"
	if r.CostFrom == nil {
		what = "count_status"
	} else if len(r.CountStatus) > 0 {
		c.add(p+".count_status", "cannot be combined with cost_from_response")
	}
	switch {
	case r.Limit.Algorithm == drip.Concurrency:
		c.add(p+"."+what, "a concurrency rule holds a slot, it has no cost to settle")
	case r.Mode == Shadow:
		c.add(p+"."+what, "is for enforce rules only")
	case r.OnError == Local:
		c.add(p+"."+what, "cannot be combined with on_error: local (use allow or deny)")
	}
}
