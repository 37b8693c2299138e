// Package upstream is a stand-in model server for the example and its
// tests. It answers OpenAI's Chat Completions (POST /v1/chat/completions)
// and Anthropic's Messages (POST /v1/messages), streamed (server-sent
// events) or not, in the shapes those APIs document, with the usage
// where they put it: in the JSON body, in a stream's last chunk when the
// request asks for it (stream_options.include_usage), in Anthropic's
// message_start and message_delta events.
//
// It generates "tok " tokens, at most the request's max_tokens (or
// max_completion_tokens), as a real server does. Headers that a test
// sets choose the rest:
//
//   - X-Test-Prompt-Tokens: the input tokens it reports (default 10);
//   - X-Test-Cached-Tokens: how many of those it reports as read from
//     its cache (OpenAI's cached_tokens; default 0);
//   - X-Test-Completion-Tokens: the tokens it would generate without a
//     maximum (default 20);
//   - X-Test-Fail: a status (500, 529, ...) it answers at once, with the
//     API's error body;
//   - X-Test-Cut: after that many tokens of a stream it drops the
//     connection, reporting no usage (a server that fails mid-stream);
//   - X-Test-Hold: after that many tokens of a stream it waits for the
//     client to go away (a client that aborts mid-stream, for sure).
//
// It stops early, reporting what it generated so far, when the client
// goes away.
package upstream

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Server is the stand-in: it answers both APIs and counts the tokens it
// spent.
type Server struct {
	mux   *http.ServeMux
	spent atomic.Int64
	input atomic.Int64
}

// New returns a stand-in.
func New() *Server {
	s := &Server{mux: http.NewServeMux()}
	s.mux.HandleFunc("POST /v1/chat/completions", s.chat)
	s.mux.HandleFunc("POST /v1/messages", s.messages)
	s.mux.HandleFunc("POST /v1/responses", s.responses)
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Spent is the tokens of every call it answered with 200 so far: each
// call's input tokens and every token it generated, whether or not it
// could report them (a stream cut or abandoned).
func (s *Server) Spent() int64 { return s.spent.Load() }

// Input is the input tokens of every call it answered with 200 so far
// (of Spent; the rest were generated).
func (s *Server) Input() int64 { return s.input.Load() }

// answered counts a call's input tokens.
func (s *Server) answered(c *call) {
	s.spent.Add(int64(c.prompt))
	s.input.Add(int64(c.prompt))
}

// Handler answers both APIs (New, without the count).
func Handler() http.Handler { return New() }

// call is what a request asked for.
type call struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	MaxTokens     *int   `json:"max_tokens"`
	MaxCompletion *int   `json:"max_completion_tokens"`
	MaxOutput     *int   `json:"max_output_tokens"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`

	prompt, cached, completion, cut, hold int
	fail                                  int
}

func read(w http.ResponseWriter, r *http.Request, errorBody func(status int, typ, msg string) []byte) (*call, bool) {
	var c call
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 8<<20)).Decode(&c); err != nil {
		writeJSON(w, 400, errorBody(400, "invalid_request_error", "the body is not a JSON object: "+err.Error()))
		return nil, false
	}
	c.prompt = number(r.Header.Get("X-Test-Prompt-Tokens"), 10)
	c.cached = min(number(r.Header.Get("X-Test-Cached-Tokens"), 0), c.prompt)
	c.completion = number(r.Header.Get("X-Test-Completion-Tokens"), 20)
	c.cut = number(r.Header.Get("X-Test-Cut"), -1)
	c.hold = number(r.Header.Get("X-Test-Hold"), -1)
	for _, m := range []*int{c.MaxTokens, c.MaxCompletion, c.MaxOutput} {
		if m != nil && *m >= 0 {
			c.completion = min(c.completion, *m)
		}
	}
	if c.fail = number(r.Header.Get("X-Test-Fail"), 0); c.fail >= 400 {
		writeJSON(w, c.fail, errorBody(c.fail, "api_error", "the stand-in fails as asked"))
		return nil, false
	}
	return &c, true
}

// chat answers OpenAI's Chat Completions.
func (srv *Server) chat(w http.ResponseWriter, r *http.Request) {
	c, ok := read(w, r, openAIError)
	if !ok {
		return
	}
	srv.answered(c)
	id, created := "chatcmpl-standin", time.Now().Unix()
	finish := func(n int) string {
		if n < c.completion || c.MaxTokens == nil && c.MaxCompletion == nil {
			return "stop"
		}
		return "length"
	}
	if !c.Stream {
		n := c.completion
		srv.spent.Add(int64(n))
		writeJSON(w, 200, marshal(map[string]any{
			"id": id, "object": "chat.completion", "created": created, "model": c.Model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": finish(n), "logprobs": nil,
				"message": map[string]any{"role": "assistant", "content": strings.Repeat("tok ", n), "refusal": nil}}},
			"usage": openAIUsage(c, n),
		}))
		return
	}
	usage := c.StreamOptions != nil && c.StreamOptions.IncludeUsage
	chunk := func(choices []any, u any) []byte {
		m := map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": c.Model, "choices": choices}
		if usage {
			m["usage"] = u
		}
		return marshal(m)
	}
	choice := func(delta map[string]any, finish any) []any {
		return []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}}
	}
	s := newStream(w, r, &srv.spent)
	s.event("", chunk(choice(map[string]any{"role": "assistant", "content": ""}, nil), nil))
	n := s.tokens(c, "", func() []byte { return chunk(choice(map[string]any{"content": "tok "}, nil), nil) })
	if n < 0 {
		return
	}
	s.event("", chunk(choice(map[string]any{}, finish(n)), nil))
	if usage {
		s.event("", chunk([]any{}, openAIUsage(c, n)))
	}
	s.event("", []byte("[DONE]"))
}

// responses answers OpenAI's Responses API.
func (srv *Server) responses(w http.ResponseWriter, r *http.Request) {
	c, ok := read(w, r, openAIError)
	if !ok {
		return
	}
	srv.answered(c)
	response := func(status string, n int, usage any) map[string]any {
		output := []any{}
		if status == "completed" {
			output = []any{map[string]any{"type": "message", "id": "msg_standin", "status": "completed", "role": "assistant",
				"content": []any{map[string]any{"type": "output_text", "text": strings.Repeat("tok ", n), "annotations": []any{}}}}}
		}
		return map[string]any{"id": "resp_standin", "object": "response", "created_at": time.Now().Unix(), "status": status,
			"model": c.Model, "output": output, "usage": usage}
	}
	usage := func(n int) map[string]any {
		return map[string]any{"input_tokens": c.prompt, "input_tokens_details": map[string]int{"cached_tokens": c.cached},
			"output_tokens": n, "output_tokens_details": map[string]int{"reasoning_tokens": 0}, "total_tokens": c.prompt + n}
	}
	if !c.Stream {
		srv.spent.Add(int64(c.completion))
		writeJSON(w, 200, marshal(response("completed", c.completion, usage(c.completion))))
		return
	}
	s := newStream(w, r, &srv.spent)
	seq := 0
	event := func(typ string, m map[string]any) {
		m["type"], m["sequence_number"] = typ, seq
		seq++
		s.event(typ, marshal(m))
	}
	event("response.created", map[string]any{"response": response("in_progress", 0, nil)})
	n := s.tokens(c, "response.output_text.delta", func() []byte {
		m := map[string]any{"type": "response.output_text.delta", "item_id": "msg_standin", "output_index": 0,
			"content_index": 0, "delta": "tok ", "sequence_number": seq}
		seq++
		return marshal(m)
	})
	if n < 0 {
		return
	}
	event("response.completed", map[string]any{"response": response("completed", n, usage(n))})
}

func openAIUsage(c *call, completion int) map[string]any {
	return map[string]any{"prompt_tokens": c.prompt, "completion_tokens": completion, "total_tokens": c.prompt + completion,
		"prompt_tokens_details":     map[string]int{"cached_tokens": c.cached},
		"completion_tokens_details": map[string]int{"reasoning_tokens": 0}}
}

func openAIError(_ int, typ, msg string) []byte {
	return marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": nil}})
}

// messages answers Anthropic's Messages.
func (srv *Server) messages(w http.ResponseWriter, r *http.Request) {
	c, ok := read(w, r, anthropicError)
	if !ok {
		return
	}
	if c.MaxTokens == nil {
		writeJSON(w, 400, anthropicError(400, "invalid_request_error", "max_tokens: Field required"))
		return
	}
	srv.answered(c)
	id := "msg_standin"
	stop := func(n int) string {
		if n < *c.MaxTokens {
			return "end_turn"
		}
		return "max_tokens"
	}
	if !c.Stream {
		n := c.completion
		srv.spent.Add(int64(n))
		writeJSON(w, 200, marshal(map[string]any{
			"id": id, "type": "message", "role": "assistant", "model": c.Model,
			"content":     []any{map[string]any{"type": "text", "text": strings.Repeat("tok ", n)}},
			"stop_reason": stop(n), "stop_sequence": nil,
			"usage": map[string]any{"input_tokens": c.prompt, "output_tokens": n,
				"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
		}))
		return
	}
	s := newStream(w, r, &srv.spent)
	s.event("message_start", marshal(map[string]any{"type": "message_start", "message": map[string]any{
		"id": id, "type": "message", "role": "assistant", "model": c.Model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": c.prompt, "output_tokens": 1,
			"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}}))
	s.event("content_block_start", marshal(map[string]any{"type": "content_block_start", "index": 0,
		"content_block": map[string]any{"type": "text", "text": ""}}))
	s.event("ping", []byte(`{"type": "ping"}`))
	n := s.tokens(c, "content_block_delta", func() []byte {
		return marshal(map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "text_delta", "text": "tok "}})
	})
	if n < 0 {
		return
	}
	s.event("content_block_stop", []byte(`{"type":"content_block_stop","index":0}`))
	s.event("message_delta", marshal(map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stop(n), "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": n}}))
	s.event("message_stop", []byte(`{"type":"message_stop"}`))
}

func anthropicError(_ int, typ, msg string) []byte {
	return marshal(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
}

// stream writes server-sent events, each flushed.
type stream struct {
	w     http.ResponseWriter
	r     *http.Request
	rc    *http.ResponseController
	spent *atomic.Int64
}

func newStream(w http.ResponseWriter, r *http.Request, spent *atomic.Int64) *stream {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	return &stream{w, r, http.NewResponseController(w), spent}
}

func (s *stream) event(name string, data []byte) {
	if name != "" {
		fmt.Fprintf(s.w, "event: %s\n", name)
	}
	fmt.Fprintf(s.w, "data: %s\n\n", data)
	_ = s.rc.Flush()
}

// tokens streams c's tokens, each an event called name; it returns how many it sent, or -1 when it
// dropped the connection (X-Test-Cut). A client gone ends it early.
func (s *stream) tokens(c *call, name string, ev func() []byte) int {
	n := 0
	for ; n < c.completion; n++ {
		if n == c.cut {
			panic(http.ErrAbortHandler)
		}
		if n == c.hold {
			<-s.r.Context().Done()
		}
		if s.r.Context().Err() != nil {
			break
		}
		s.spent.Add(1)
		s.event(name, ev())
	}
	if n == c.cut {
		panic(http.ErrAbortHandler)
	}
	return n
}

func marshal(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}

func number(s string, def int) int {
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n <= 1_000_000 {
		return n
	}
	return def
}
