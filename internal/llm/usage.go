package llm

import (
	"mime"
	"strconv"
	"strings"
)

// API is a model server's API: how its requests and responses tell
// tokens.
type API string

const (
	// OpenAI: Chat Completions, Completions, the Responses API and
	// embeddings, as OpenAI and the servers compatible with it (vLLM,
	// Ollama's /v1, llama.cpp's server) send them.
	OpenAI API = "openai"
	// Anthropic: the Messages API.
	Anthropic API = "anthropic"
)

// Part is which of a call's tokens a rule counts.
type Part string

const (
	Total  Part = ""       // every token (the input and the output)
	Input  Part = "input"  // the input (prompt) tokens
	Output Part = "output" // the generated tokens
)

// ParseName reads the name of a rule's usage or bound: an API ("openai",
// "anthropic"), for every token, or an API and a part ("openai:input",
// "anthropic:output"), or its price ("openai:money", priced by a price
// table: Request.MoneyBound, Usage.Money).
func ParseName(s string) (API, Part, bool) {
	a, p, _ := strings.Cut(s, ":")
	switch API(a) {
	case OpenAI, Anthropic:
	default:
		return "", "", false
	}
	switch Part(p) {
	case Total, Input, Output, Money:
		return API(a), Part(p), p != "" || !strings.Contains(s, ":")
	}
	return "", "", false
}

// Usage is what a response reported of its tokens; each field is -1
// when it reported nothing of it. The fields are the last values
// reported: a streamed response's counts are cumulative (Anthropic's
// message_delta events, vLLM's continuous usage), so the last is the
// whole.
type Usage struct {
	// Input is the prompt's tokens: OpenAI's prompt_tokens or
	// input_tokens (cached tokens included), Anthropic's input_tokens
	// (cached tokens not included).
	Input int64
	// Output is the generated tokens: completion_tokens or output_tokens
	// (reasoning tokens included).
	Output int64
	// Total is OpenAI's total_tokens.
	Total int64
	// CachedInput is OpenAI's cached_tokens (of Input).
	CachedInput int64
	// Reasoning is OpenAI's reasoning_tokens (of Output).
	Reasoning int64
	// CacheWrite and CacheRead are Anthropic's
	// cache_creation_input_tokens and cache_read_input_tokens (beside
	// Input).
	CacheWrite int64
	CacheRead  int64
}

// None is a Usage that reported nothing.
var None = Usage{-1, -1, -1, -1, -1, -1, -1}

// Tokens is the call's tokens as api counts them, ok false when the
// response reported none: for OpenAI total_tokens, else the input and
// output tokens; for Anthropic the input tokens, those written to and
// read from its cache, and the output tokens. At most MaxCount.
func (u Usage) Tokens(api API) (int64, bool) {
	if api == OpenAI && u.Total >= 0 {
		return u.Total, true
	}
	parts := []int64{u.Input, u.Output}
	if api == Anthropic {
		parts = append(parts, u.CacheWrite, u.CacheRead)
	}
	var n int64
	ok := false
	for _, p := range parts {
		if p >= 0 {
			n, ok = min(n+p, MaxCount), true
		}
	}
	return n, ok
}

// Part is the call's tokens of part as api counts them: Tokens for
// Total; the input tokens (for Anthropic, with those written to and read
// from its cache); the output tokens.
func (u Usage) Part(api API, part Part) (int64, bool) {
	switch part {
	case Input:
		if api == Anthropic {
			return Usage{Input: u.Input, CacheWrite: u.CacheWrite, CacheRead: u.CacheRead, Output: -1, Total: -1}.Tokens(api)
		}
		return u.Input, u.Input >= 0
	case Output:
		return u.Output, u.Output >= 0
	case Money:
		return 0, false // a price needs the price table (Money)
	}
	return u.Tokens(api)
}

// String is the usage's fields as key=value pairs, those reported only.
func (u Usage) String() string {
	var b strings.Builder
	for _, f := range []struct {
		name string
		v    int64
	}{{"input", u.Input}, {"output", u.Output}, {"total", u.Total}, {"cached_input", u.CachedInput},
		{"reasoning", u.Reasoning}, {"cache_write", u.CacheWrite}, {"cache_read", u.CacheRead}} {
		if f.v >= 0 {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(f.name + "=" + strconv.FormatInt(f.v, 10))
		}
	}
	return b.String()
}

// Framing of a response body.
const (
	framingNone = iota // not read: usage is not reported in it
	framingJSON        // one JSON value (application/json)
	framingSSE         // server-sent events, each data a JSON value
)

// Scanner reads the usage of a response as its body goes by (Write),
// whatever the body's length, in a fixed few hundred bytes. It reads
// "usage" objects at the top of a JSON body or of an event's data, and
// inside a top-level "response" (the Responses API's
// response.completed, response.incomplete and response.failed events)
// or "message" (Anthropic's message_start event). Its zero value reads
// nothing; NewScanner makes one for a response's headers.
type Scanner struct {
	framing uint8
	usage   Usage
	final   bool // a count was read where the whole call's usage is
	tok     tokenizer

	// Server-sent events: the field name of the line being read.
	field    [8]byte
	fieldLen uint8
	line     uint8 // where in a line: lineStart, lineField, lineSkipSpace, lineData, lineOther
	cr       bool  // the last byte was '\r'
	inEvent  bool  // a data line was read in this event
}

// Where a Scanner is in a line of server-sent events.
const (
	lineStart = iota
	lineField
	lineSkipSpace
	lineData
	lineOther
)

// NewScanner returns a Scanner for a response with these Content-Type
// and Content-Encoding values: a JSON body, or server-sent events; a
// compressed body, or one of another type, is not read (it reports no
// usage).
func NewScanner(contentType, contentEncoding string) *Scanner {
	s := &Scanner{usage: None}
	s.tok.scalar = s.scalar
	if contentEncoding != "" && !strings.EqualFold(contentEncoding, "identity") {
		return s
	}
	mt, _, err := mime.ParseMediaType(contentType)
	switch {
	case err != nil:
	case mt == "text/event-stream":
		s.framing = framingSSE
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		s.framing = framingJSON
	}
	return s
}

// Reads reports whether the scanner reads its body at all.
func (s *Scanner) Reads() bool { return s != nil && s.framing != framingNone }

// Usage returns what the body read so far reported.
func (s *Scanner) Usage() Usage {
	if s == nil {
		return None
	}
	return s.usage
}

// Tokens is the call's tokens as api counts them (Usage.Tokens), ok
// false until the body reported its whole usage: a top-level "usage"
// (a JSON body, OpenAI's last chunk, Anthropic's message_delta) or the
// Responses API's "response". Anthropic's message_start reports the
// input and a placeholder of the output: a stream cut after it has not
// reported its usage.
func (s *Scanner) Tokens(api API, part Part) (int64, bool) {
	if s == nil || !s.final {
		return 0, false
	}
	return s.usage.Part(api, part)
}

// Write reads p, a part of the body; it never fails.
func (s *Scanner) Write(p []byte) (int, error) {
	switch s.framing {
	case framingJSON:
		s.tok.write(p)
	case framingSSE:
		s.sse(p)
	}
	return len(p), nil
}

// sse reads server-sent events: the data lines of each event are one
// JSON text (joined by newlines, as the format says); a blank line ends
// the event.
func (s *Scanner) sse(p []byte) {
	for len(p) > 0 {
		c := p[0]
		if c == '\n' && s.cr {
			s.cr = false
			p = p[1:]
			continue
		}
		s.cr = c == '\r'
		eol := c == '\n' || c == '\r'
		switch s.line {
		case lineStart:
			if eol { // a blank line: the event ends
				s.endEvent()
				p = p[1:]
				continue
			}
			s.line, s.fieldLen = lineField, 0
			continue // read c as the field's first byte
		case lineField:
			switch {
			case eol:
				s.line = lineStart
			case c == ':':
				s.line = lineOther
				if string(s.field[:s.fieldLen]) == "data" {
					s.line = lineSkipSpace
					if s.inEvent {
						s.tok.write([]byte{'\n'})
					}
					s.inEvent = true
				}
			case s.fieldLen < uint8(len(s.field)):
				s.field[s.fieldLen] = c
				s.fieldLen++
			default:
				s.line = lineOther
			}
		case lineSkipSpace, lineData:
			if eol {
				s.line = lineStart
				break
			}
			if s.line == lineSkipSpace {
				s.line = lineData
				if c == ' ' {
					break
				}
			}
			// The rest of the line, up to its end, in one call.
			n := 0
			for n < len(p) && p[n] != '\n' && p[n] != '\r' {
				n++
			}
			s.tok.write(p[:n])
			p = p[n:]
			continue
		case lineOther:
			if eol {
				s.line = lineStart
			}
		}
		p = p[1:]
	}
}

func (s *Scanner) endEvent() {
	if s.inEvent {
		s.tok.end()
	}
	s.tok.reset()
	s.inEvent = false
}

// scalar keeps a count found at one of the paths of usage.
func (s *Scanner) scalar(t *tokenizer, kind uint8, v []byte, cut bool) {
	// The usage object: at the top, or in a top-level response or
	// message.
	u := 0
	switch k0 := t.key(0); {
	case is(k0, "usage"):
	case is(t.key(1), "usage") && (is(k0, "response") || is(k0, "message")):
		u = 1
	default:
		return
	}
	var f *int64
	switch rest := t.depth - u - 1; {
	case rest == 1:
		switch string(t.key(u + 1)) {
		case "prompt_tokens", "input_tokens":
			f = &s.usage.Input
		case "completion_tokens", "output_tokens":
			f = &s.usage.Output
		case "total_tokens":
			f = &s.usage.Total
		case "cache_creation_input_tokens":
			f = &s.usage.CacheWrite
		case "cache_read_input_tokens":
			f = &s.usage.CacheRead
		}
	case rest == 2:
		switch d, k := t.key(u+1), t.key(u+2); {
		case (is(d, "prompt_tokens_details") || is(d, "input_tokens_details")) && is(k, "cached_tokens"):
			f = &s.usage.CachedInput
		case (is(d, "completion_tokens_details") || is(d, "output_tokens_details")) && is(k, "reasoning_tokens"):
			f = &s.usage.Reasoning
		}
	}
	if f == nil || kind != kNumber {
		return
	}
	if n, ok := count(kind, v, cut); ok {
		*f = n
		s.final = s.final || !is(t.key(0), "message")
	}
}

// is reports whether b is s (without a copy).
func is(b []byte, s string) bool { return string(b) == s }
