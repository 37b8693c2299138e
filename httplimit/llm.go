package httplimit

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/llm"
	"github.com/driplimit/drip/rules"
)

// MaxLLMBody is the most of a request's body read for a rule whose cost
// is the most a model server's call can cost (cost_source: openai or
// anthropic). A longer body has no bound: a strict budget refuses it, a
// soft one takes its default_cost. The body still reaches the handler
// whole.
const MaxLLMBody = 4 << 20

// readBody is a request body read for the rules, handed on unchanged.
type readBody struct {
	io.Reader
	io.Closer
	b     []byte
	whole bool // b is the whole body

	api llm.API // the API req was read as, if any
	req llm.Request
}

// bodyOf reads r's body for the rules, once: r.Body is replaced by one
// that gives the handler the same bytes. A body read whole is never read
// again: net/http closes a request's body once its response begins, and a
// read past the end then fails rather than ending (http.Transport, which
// forwards the body to an upstream, reads once more past Content-Length,
// and on that error drops the connection, the stream it answers with).
func bodyOf(r *http.Request) *readBody {
	if rb, ok := r.Body.(*readBody); ok {
		return rb
	}
	if r.Body == nil || r.Body == http.NoBody {
		rb := &readBody{Reader: bytes.NewReader(nil), Closer: io.NopCloser(nil), whole: true}
		r.Body = rb
		return rb
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxLLMBody+1))
	rb := &readBody{Closer: r.Body, b: b, whole: err == nil && len(b) <= MaxLLMBody}
	rb.Reader = bytes.NewReader(b)
	if !rb.whole {
		rb.Reader = io.MultiReader(rb.Reader, r.Body)
	}
	r.Body = rb
	return rb
}

// llmRequest reads r's body as api's call: its bound. It says why there
// is none when there is none.
func llmRequest(r *http.Request, api llm.API) llm.Request {
	rb := bodyOf(r)
	if !rb.whole {
		return llm.Request{Why: "its body is larger than " + strconv.Itoa(MaxLLMBody>>20) + " MiB or could not be read"}
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return llm.Request{Why: "its body is compressed (" + ce + ")"}
	}
	if rb.api != api {
		rb.api, rb.req = api, llm.ReadRequest(api, r.URL.Path, rb.b)
	}
	return rb.req
}

// bound is the value of a cost_source of kind rules.KindBound.
func (v *reqValues) bound(src rules.Source) (string, bool) {
	n, why := v.part(src)
	if why != "" {
		return "", false
	}
	return strconv.FormatInt(n, 10), true
}

// part is the bound src names (an API and a part of its tokens), or why
// the request has none.
func (v *reqValues) part(src rules.Source) (int64, string) {
	api, part, _ := llm.ParseName(src.Name)
	if part == llm.Money {
		return llmRequest(v.r, api).MoneyBound(src.Prices)
	}
	return llmRequest(v.r, api).Part(part)
}

// Unbounded says why r has no bound under rule (engine.Bounder).
func (v *reqValues) Unbounded(rule *rules.Rule) string {
	_, why := v.part(rule.CostSource)
	return why
}

// askUsage makes an OpenAI streaming call ask for its usage
// (stream_options.include_usage), which a stream reports only when
// asked, when a rule settles on it and the body does not say.
func askUsage(r *http.Request, out *engine.Outcome) {
	if r.Method != http.MethodPost || !(strings.HasSuffix(r.URL.Path, "/chat/completions") || strings.HasSuffix(r.URL.Path, "/completions")) {
		return
	}
	openai := false
	for i := range out.Applied {
		if cf := out.Applied[i].Rule.CostFrom; cf != nil {
			if api, _, _ := llm.ParseName(cf.API); api == llm.OpenAI {
				openai = true
			}
		}
	}
	if !openai {
		return
	}
	rb := bodyOf(r)
	if !rb.whole {
		return
	}
	req := llmRequest(r, llm.OpenAI)
	if !req.Stream || req.StreamOptions {
		return
	}
	b := llm.AskUsage(rb.b)
	rb.b, rb.Reader, rb.api = b, bytes.NewReader(b), ""
	r.ContentLength = int64(len(b))
	r.Header.Del("Content-Length")
}

// pricedRequest is r's body read as the API of the first rule of out
// that prices its usage ("openai:money"), for its model; the zero
// Request when none does.
func pricedRequest(r *http.Request, out *engine.Outcome) llm.Request {
	for i := range out.Applied {
		if cf := out.Applied[i].Rule.CostFrom; cf != nil {
			if api, part, _ := llm.ParseName(cf.API); part == llm.Money {
				return llmRequest(r, api)
			}
		}
	}
	return llm.Request{}
}
