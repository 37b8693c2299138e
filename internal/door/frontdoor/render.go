package frontdoor

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/sfv"
)

// This file is the HTTP rendering of an engine.Outcome, the one of every
// HTTP door (the middleware, the gateway, forward auth) and of the gRPC
// interceptors' metadata and messages: the status, the RateLimit headers
// and the application/problem+json body.

// ReasonKeyError is the reason of a refusal whose key function failed:
// the request could not be read, through no fault of the client's.
const ReasonKeyError = "key_error"

// Status is the HTTP status of an answer to out: 0 when allowed, 400 for
// a refusal (engine.Refuse; 500 when the key function failed), 503 when
// the store failed and on_error denied (engine.ReasonStoreUnavailable),
// else 429.
func Status(out *engine.Outcome) int {
	switch {
	case out.Allowed:
		return 0
	case out.Refused && out.Reason == ReasonKeyError:
		return http.StatusInternalServerError
	case out.Refused:
		return http.StatusBadRequest
	case out.Reason == engine.ReasonStoreUnavailable, out.Reason == engine.ReasonOverloaded:
		return http.StatusServiceUnavailable
	}
	return http.StatusTooManyRequests
}

// WriteHeaders sets out's RateLimit headers (and Retry-After on a 429) for
// the enforce rules that were decided (engine.Outcome.Fields). It writes
// nothing when none was (no rule applied, or the store failed and
// on_error allowed).
func WriteHeaders(h http.Header, out *engine.Outcome) {
	// One backing array for the values, and the keys in canonical form,
	// as Header.Set would store them: the headers cost one allocation,
	// not two each (the middleware writes them on every request).
	var vals []string
	for name, v := range out.Fields().All() {
		if vals == nil {
			vals = make([]string, 0, 6)
		}
		vals = append(vals, v)
		h[canonical(name)] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
}

// canonical is a field's header name in canonical form, as Header.Set
// would store it, without allocating.
func canonical(name string) string {
	switch name {
	case engine.FieldPolicy:
		return hPolicy
	case engine.FieldRateLimit:
		return hRateLimit
	case engine.FieldLimit:
		return hLimit
	case engine.FieldRemaining:
		return hRemaining
	case engine.FieldReset:
		return hReset
	case engine.FieldRetryAfter:
		return hRetryAfter
	}
	return http.CanonicalHeaderKey(name)
}

// The header names WriteHeaders sets, in canonical form.
var (
	hRetryAfter = http.CanonicalHeaderKey(engine.FieldRetryAfter)
	hPolicy     = http.CanonicalHeaderKey(engine.FieldPolicy)
	hRateLimit  = http.CanonicalHeaderKey(engine.FieldRateLimit)
	hLimit      = http.CanonicalHeaderKey(engine.FieldLimit)
	hRemaining  = http.CanonicalHeaderKey(engine.FieldRemaining)
	hReset      = http.CanonicalHeaderKey(engine.FieldReset)
)

// Problem is the application/problem+json body (RFC 9457) of a denial.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Rule is the name of the rule that denied the request.
	Rule string `json:"rule,omitempty"`
	// Reason is token_bucket_exceeded, fixed_window_exceeded,
	// concurrency_exceeded, cost_exceeds_burst or store_unavailable (or a
	// front door's own, such as the key-function middleware's key_error
	// and the middleware's ambiguous_path).
	Reason string `json:"reason"`
	// RetryAfter repeats the Retry-After header, in seconds.
	RetryAfter int64 `json:"retry_after,omitempty"`
	// Priority is, when the request was shed for its class of priority
	// (or denied by a rule that has classes), that class: critical,
	// default, sheddable, batch or a number (engine.Outcome.Shed). The
	// Drip-Priority header says it too.
	Priority string `json:"priority,omitempty"`
}

// HeaderPriority is the header of a denial that names the request's
// class of priority (Problem.Priority).
const HeaderPriority = "Drip-Priority"

// ProblemOf returns the problem details of a denied request.
func ProblemOf(out *engine.Outcome) Problem {
	status := Status(out)
	p := Problem{Type: "about:blank", Status: status, Reason: out.Reason, RetryAfter: out.RetryAfter, Priority: out.Shed}
	p.Title = http.StatusText(status)
	name := ""
	if out.Top != nil {
		name = out.Top.Rule.Name
		p.Rule = name
	}
	switch {
	case out.Refused:
		p.Detail = out.Detail
	case out.Reason == engine.ReasonCostExceedsBurst:
		a := out.Top
		p.Detail = fmt.Sprintf("the request's cost %s exceeds the burst %s of rate limit %q: it can never be allowed", sfv.Number(a.Cost), sfv.Number(a.Burst()), name)
	case out.Reason == engine.ReasonOverloaded:
		p.Detail = fmt.Sprintf("the upstream is at the in-flight limit rule %q learned from its latency", name)
		if out.Shed != "" {
			p.Detail += fmt.Sprintf(" for requests of class %s", out.Shed)
		}
		p.Detail += fmt.Sprintf("; retry after %d s", out.RetryAfter)
	case out.Reason == engine.ReasonShed:
		p.Detail = fmt.Sprintf("rule %q keeps its remaining capacity for requests of a higher class than %s; retry after %d s", name, out.Shed, out.RetryAfter)
	case out.Reason == engine.ReasonStoreUnavailable:
		p.Detail = fmt.Sprintf("the rate limit store is unavailable and rule %q denies requests then (how long a decision waits on the store is store_timeout; when it counts as down, circuit_breaker)", name)
	default:
		unit := "seconds"
		if out.RetryAfter == 1 {
			unit = "second"
		}
		p.Detail = fmt.Sprintf("rate limit %q exceeded; retry after %d %s", name, out.RetryAfter, unit)
	}
	return p
}

// ProblemJSON is the problem+json body of a denied request, without the
// final newline.
func ProblemJSON(out *engine.Outcome) []byte {
	body, _ := json.Marshal(ProblemOf(out))
	return body
}

// WriteError writes the status and problem+json body of a denied
// request. Call WriteHeaders first.
func WriteError(w http.ResponseWriter, out *engine.Outcome) {
	WriteErrorAs(w, out, Status(out))
}

// WriteErrorAs writes the problem+json body of a denied request under
// status instead of the denial's own (Status), for a front door whose
// caller passes on only some statuses (nginx's auth_request: 401 and
// 403). The body still says the denial's status. Call WriteHeaders first.
func WriteErrorAs(w http.ResponseWriter, out *engine.Outcome, status int) {
	if out.Shed != "" {
		w.Header().Set(HeaderPriority, out.Shed)
	}
	writeProblem(w, status, ProblemJSON(out))
}

// WriteProblem writes p as the response: its status and its
// application/problem+json body, never cached.
func WriteProblem(w http.ResponseWriter, p Problem) {
	body, _ := json.Marshal(p)
	writeProblem(w, p.Status, body)
}

func writeProblem(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}
