package httplimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/rules"
)

// The RateLimit headers (after draft-ietf-httpapi-ratelimit-headers):
//
//	RateLimit-Policy: "free";q=20;w=2     every enforce rule decided: q = burst, w = seconds to fill from empty
//	RateLimit: "free";r=7;t=2             r = remaining, t = seconds until full (on a 429, for the rules that denied, the Retry-After value)
//	RateLimit-Limit: 20                   the most restrictive rule (least remaining; on a denial the denying one)
//	RateLimit-Remaining: 7
//	RateLimit-Reset: 2
//
// Every value is a structured field (RFC 8941). A rule's name is an
// sf-string, which holds printable ASCII only: other bytes are written as
// %xx (see sfv.String: "café" is "caf%c3%a9"). Shadow rules never show in
// headers.

// policyItem is a RateLimit-Policy item for a rule under limit l.
func policyItem(name string, l drip.Limit) string {
	return sfv.String(name) + ";q=" + amount(burst(l)) + ";w=" + strconv.FormatInt(drip.CeilSeconds(l.FillTime()), 10)
}

// amount formats a number of tokens for a header: an integer when it is
// one, else a structured-field decimal (at most three decimal places,
// rounded down).
func amount(x float64) string { return sfv.Number(x) }

// t is the RateLimit "t" of an applied rule.
func (res *Result) t(a *Applied) int64 {
	if !res.Allowed && res.RetryAfter > 0 && a.Reason != "" {
		return res.RetryAfter
	}
	return drip.CeilSeconds(a.Decision.ResetAfter)
}

// WriteHeaders sets the RateLimit headers (and Retry-After on a 429) for
// the enforce rules that were decided. It writes nothing when none was
// (no rule applied, or the store failed and on_error allowed).
func (res *Result) WriteHeaders(h http.Header) {
	if res.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(res.RetryAfter, 10))
	}
	if res.Top == nil || !res.Top.Decided {
		return
	}
	var policy, limit strings.Builder
	for i := range res.Applied {
		a := &res.Applied[i]
		if a.Rule.Mode == rules.Shadow || !a.Decided {
			continue
		}
		if policy.Len() > 0 {
			policy.WriteString(", ")
			limit.WriteString(", ")
		}
		policy.WriteString(a.policy)
		limit.WriteString(sfv.String(a.Rule.Name))
		limit.WriteString(";r=")
		limit.WriteString(strconv.FormatInt(a.Decision.Remaining, 10))
		limit.WriteString(";t=")
		limit.WriteString(strconv.FormatInt(res.t(a), 10))
	}
	top := res.Top
	h.Set("RateLimit-Policy", policy.String())
	h.Set("RateLimit", limit.String())
	h.Set("RateLimit-Limit", amount(burst(top.Limit)))
	h.Set("RateLimit-Remaining", strconv.FormatInt(top.Decision.Remaining, 10))
	h.Set("RateLimit-Reset", strconv.FormatInt(res.t(top), 10))
}

// Problem is the application/problem+json body (RFC 9457) of a denial.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Rule is the name of the rule that denied the request.
	Rule string `json:"rule,omitempty"`
	// Reason is token_bucket_exceeded, fixed_window_exceeded,
	// cost_exceeds_burst or store_unavailable.
	Reason string `json:"reason"`
	// RetryAfter repeats the Retry-After header, in seconds.
	RetryAfter int64 `json:"retry_after,omitempty"`
}

// Problem returns the problem+json body of a denied request.
func (res *Result) Problem() Problem {
	p := Problem{Type: "about:blank", Status: res.Status, Reason: res.Reason, RetryAfter: res.RetryAfter}
	p.Title = http.StatusText(res.Status)
	name := ""
	if res.Top != nil {
		name = res.Top.Rule.Name
		p.Rule = name
	}
	switch res.Reason {
	case ReasonCostExceedsBurst:
		a := res.Top
		p.Detail = fmt.Sprintf("the request's cost %s exceeds the burst %s of rate limit %q: it can never be allowed", amount(a.Cost), amount(burst(a.Limit)), name)
	case ReasonStoreUnavailable:
		p.Detail = fmt.Sprintf("the rate limit store is unavailable and rule %q denies requests then", name)
	default:
		p.Detail = fmt.Sprintf("rate limit %q exceeded; retry after %d seconds", name, res.RetryAfter)
	}
	return p
}

// WriteError writes the status and problem+json body of a denied
// request. Call WriteHeaders first.
func (res *Result) WriteError(w http.ResponseWriter) {
	body, _ := json.Marshal(res.Problem())
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(res.Status)
	w.Write(append(body, '\n'))
}
