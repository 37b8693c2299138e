package frontdoor

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
)

// This file renders an outcome as a model server's API does, for rules
// that read one (cost_from_response or cost_source openai or anthropic):
// its rate limit headers on every answer, and its error body on a
// denial, so that the official SDKs read them (and retry a 429 after its
// Retry-After, not one that can never pass). The RateLimit headers stay.

// API is the model server API of the rules that applied to out: that of
// the rule that decided it (Top), else the first applied rule that reads
// one; "" for none.
func API(out *engine.Outcome) string {
	if out.Top != nil {
		if api := ruleAPI(out.Top.Rule); api != "" {
			return api
		}
	}
	for i := range out.Applied {
		if api := ruleAPI(out.Applied[i].Rule); api != "" {
			return api
		}
	}
	return ""
}

func ruleAPI(r *rules.Rule) string {
	name := ""
	switch {
	case r.CostFrom != nil && r.CostFrom.API != "":
		name = r.CostFrom.API
	case r.CostSource.Kind == rules.KindBound:
		name = r.CostSource.Name
	}
	api, _, _ := strings.Cut(name, ":") // openai:input is OpenAI's
	return api
}

// WriteAPIHeaders sets the rate limit headers of out's API (API), of
// the most restrictive enforce rule of each kind: tokens (the rules that
// read the API) and requests (the others). OpenAI's x-ratelimit-limit-,
// -remaining- and -reset-requests and -tokens (the reset a duration,
// "1m30s"); Anthropic's anthropic-ratelimit-requests- and -tokens-
// -limit, -remaining and -reset (the reset a time, RFC 3339, from now).
func WriteAPIHeaders(h http.Header, out *engine.Outcome, now time.Time) {
	api := API(out)
	if api == "" {
		return
	}
	var tokens, requests *engine.Applied
	for i := range out.Applied {
		a := &out.Applied[i]
		if !a.Decided || a.Rule.Mode == rules.Shadow {
			continue
		}
		p := &requests
		if ruleAPI(a.Rule) != "" {
			p = &tokens
		}
		if *p == nil || a.Decision.Remaining < (*p).Decision.Remaining {
			*p = a
		}
	}
	for _, k := range []struct {
		kind string
		a    *engine.Applied
	}{{"requests", requests}, {"tokens", tokens}} {
		if k.a == nil {
			continue
		}
		d := k.a.Decision
		limit, left := strconv.FormatInt(int64(k.a.Burst()), 10), strconv.FormatInt(max(d.Remaining, 0), 10)
		reset := d.ResetAfter.Round(time.Millisecond)
		if api == "anthropic" {
			h.Set("Anthropic-Ratelimit-"+k.kind+"-Limit", limit)
			h.Set("Anthropic-Ratelimit-"+k.kind+"-Remaining", left)
			h.Set("Anthropic-Ratelimit-"+k.kind+"-Reset", now.Add(reset).UTC().Format(time.RFC3339))
		} else {
			h.Set("X-Ratelimit-Limit-"+k.kind, limit)
			h.Set("X-Ratelimit-Remaining-"+k.kind, left)
			h.Set("X-Ratelimit-Reset-"+k.kind, reset.String())
		}
	}
}

// The error bodies, their fields in the order the APIs send them.
type (
	openAIError struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"` // null
			Code    string  `json:"code"`
		} `json:"error"`
	}
	anthropicError struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
)

// WriteAPIError writes the denial out as its API's error (API, which
// must not be ""): OpenAI's {"error": {"message", "type", "param",
// "code"}} (a 429: code rate_limit_exceeded, type tokens or requests)
// and Anthropic's {"type": "error", "error": {"type", "message"}} (a
// 429: rate_limit_error), with the status of Status. A 429 carries Retry-After-Ms
// beside Retry-After (both SDKs read it first); one that can never pass
// (cost_exceeds_burst) says x-should-retry: false, so that no SDK
// retries it. Call WriteHeaders and WriteAPIHeaders first.
func WriteAPIError(w http.ResponseWriter, out *engine.Outcome) {
	status := Status(out)
	p := ProblemOf(out)
	h := w.Header()
	var typ string
	switch {
	case status == http.StatusTooManyRequests:
		typ = "rate_limit_exceeded"
		if out.Reason == engine.ReasonCostExceedsBurst {
			h.Set("X-Should-Retry", "false")
		} else {
			h.Set("Retry-After-Ms", strconv.FormatInt(out.RetryAfter*1000, 10))
		}
	case status == http.StatusBadRequest:
		typ = "invalid_request_error"
	default:
		typ = "server_error"
	}
	var body any
	if API(out) == "anthropic" {
		switch typ {
		case "rate_limit_exceeded":
			typ = "rate_limit_error"
		case "server_error":
			typ = "api_error"
		}
		var e anthropicError
		e.Type, e.Error.Type, e.Error.Message = "error", typ, p.Detail
		body = e
	} else {
		// As OpenAI answers a 429: the code rate_limit_exceeded, the
		// type the kind of limit (tokens or requests).
		code := out.Reason
		if typ == "rate_limit_exceeded" {
			code, typ = typ, "requests"
			if out.Top != nil && ruleAPI(out.Top.Rule) != "" {
				typ = "tokens"
			}
		}
		var e openAIError
		e.Error.Message, e.Error.Type, e.Error.Code = p.Detail, typ, code
		body = e
	}
	b, _ := json.Marshal(body)
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
