package llm

import (
	"bytes"
	"strconv"
	"strings"
)

// Request is what a request's JSON body says of its cost (ReadRequest).
type Request struct {
	// Bound is the most tokens the call can cost, when Bounded: the
	// body's length in bytes (a tokenizer never makes more tokens of a
	// text than it has bytes, and the body holds the prompt), plus its
	// output maximum times the choices it asks for.
	Bound   int64
	Bounded bool
	// Why says why the call has no bound, when it has none.
	Why string
	// Input and Output are the bounds of each part (Bound is their sum):
	// the body's length, and its output maximum times its choices; -1
	// when the part has none (InputWhy, OutputWhy say why).
	Input, Output       int64
	InputWhy, OutputWhy string
	// Stream: the body asks for a stream ("stream": true).
	Stream bool
	// StreamOptions: the body has a top-level "stream_options".
	StreamOptions bool
	// Model is the body's top-level "model", when it names one; ModelWhy
	// says why it does not (none, not a string, longer than MaxModel
	// bytes or escaped, given twice with two names).
	Model    string
	ModelWhy string
}

// ReadRequest reads a request's JSON body under api, for the call at
// path (an OpenAI embeddings call, whose path ends in /embeddings,
// generates nothing): its output maximum (OpenAI's max_completion_tokens,
// max_tokens or max_output_tokens, the largest of those present, times
// its n or best_of; Anthropic's max_tokens) and its length give Bound.
// A body that is not a JSON object, an output maximum that is not a
// number, or none at all (except for embeddings), and an OpenAI call that
// builds on input stored by the server (previous_response_id,
// conversation), have no bound. A key repeated counts at its largest.
func ReadRequest(api API, path string, body []byte) Request {
	r := Request{}
	var out, choices int64 = -1, 1
	why, stored := "", ""    // why the output, the input has no bound
	model, seen := "", false // why the model is not read; a model was seen
	var t tokenizer
	t.scalar = func(t *tokenizer, kind uint8, v []byte, cut bool) {
		if t.depth != 1 {
			return
		}
		k := t.key(0)
		// atLeast raises *to to the count v holds (null: none).
		atLeast := func(to *int64) {
			if kind == kLiteral && string(v) == "null" {
				return
			}
			if n, ok := count(kind, v, cut); ok {
				*to = max(*to, n)
			} else {
				why = "its " + string(k) + " is not a number"
			}
		}
		switch {
		case is(k, "model"):
			switch m := string(v); {
			case kind != kString || cut || bytes.IndexByte(v, '\\') >= 0:
				model = "its model is not a name of at most " + strconv.Itoa(MaxModel) + " plain bytes"
			case seen && m != r.Model:
				model = "its model is given twice"
			default:
				r.Model = m
			}
			seen = true
		case is(k, "stream"):
			r.Stream = kind == kLiteral && string(v) == "true"
		case is(k, "max_tokens") || (api == OpenAI && (is(k, "max_completion_tokens") || is(k, "max_output_tokens"))):
			atLeast(&out)
		case api == OpenAI && (is(k, "n") || is(k, "best_of")):
			atLeast(&choices)
		case is(k, "stream_options"):
			r.StreamOptions = true
		case api == OpenAI && (is(k, "previous_response_id") || is(k, "conversation")):
			if kind != kLiteral || string(v) != "null" {
				stored = "it builds on input the server keeps (" + string(k) + ")"
			}
		}
	}
	// Values that are objects or arrays at the top.
	t.open = func(t *tokenizer) {
		if t.depth != 2 {
			return
		}
		switch k := t.key(0); {
		case is(k, "stream_options"):
			r.StreamOptions = true
		case is(k, "model"):
			model, seen = "its model is not a name", true
		case api == OpenAI && is(k, "conversation"):
			stored = "it builds on input the server keeps (conversation)"
		case is(k, "max_tokens") || (api == OpenAI && (is(k, "max_completion_tokens") || is(k, "max_output_tokens") || is(k, "n") || is(k, "best_of"))):
			why = "its " + string(k) + " is not a number"
		}
	}
	t.write(body)
	t.end()
	switch {
	case model != "":
		r.ModelWhy, r.Model = model, ""
	case !seen:
		r.ModelWhy = "it names no model"
	}
	r.Input, r.Output = int64(len(body)), mulSat(max(out, 0), choices)
	switch {
	case t.state != sDone || firstByte(body) != '{':
		r.InputWhy = "its body is not a JSON object"
		r.OutputWhy = r.InputWhy
	case stored != "":
		r.InputWhy = stored
	}
	switch {
	case r.OutputWhy != "":
	case why != "":
		r.OutputWhy = why
	case out < 0 && !(api == OpenAI && strings.HasSuffix(path, "/embeddings")):
		if api == Anthropic {
			r.OutputWhy = "it sets no max_tokens"
		} else {
			r.OutputWhy = "it sets no max_completion_tokens, max_tokens or max_output_tokens"
		}
	}
	if r.InputWhy != "" {
		r.Input = -1
	}
	if r.OutputWhy != "" {
		r.Output = -1
	}
	switch {
	case r.InputWhy != "":
		r.Why = r.InputWhy
	case r.OutputWhy != "":
		r.Why = r.OutputWhy
	default:
		r.Bound, r.Bounded = min(r.Input+r.Output, MaxCount), true
	}
	return r
}

// Part is the bound of part, ok false with why when it has none.
func (r Request) Part(part Part) (n int64, why string) {
	switch part {
	case Input:
		return r.Input, r.InputWhy
	case Output:
		return r.Output, r.OutputWhy
	case Money:
		return -1, "its price needs a price table (MoneyBound)"
	}
	if !r.Bounded {
		return -1, r.Why
	}
	return r.Bound, ""
}

func mulSat(a, b int64) int64 {
	if b != 0 && a > MaxCount/b {
		return MaxCount
	}
	return a * b
}

func firstByte(b []byte) byte {
	for _, c := range b {
		if !isSpace(c) {
			return c
		}
	}
	return 0
}

// AskUsage returns an OpenAI streaming request's body with
// "stream_options": {"include_usage": true} added, so that the stream's
// last event reports its usage (servers report none in a stream
// otherwise). Call it only for a body ReadRequest read as a stream
// without stream_options.
func AskUsage(body []byte) []byte {
	i := bytes.IndexByte(body, '{')
	if i < 0 {
		return body
	}
	const opt = `"stream_options":{"include_usage":true},`
	out := make([]byte, 0, len(body)+len(opt))
	out = append(out, body[:i+1]...)
	out = append(out, opt...)
	return append(out, body[i+1:]...)
}
