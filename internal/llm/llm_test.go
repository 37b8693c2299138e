package llm

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"
)

// Bodies as the APIs document them (abridged to the fields that matter,
// and some that must not be mistaken for usage).
const (
	chatJSON = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o",
 "choices":[{"index":0,"message":{"role":"assistant","content":"\"usage\": {\"total_tokens\": 1}"},"finish_reason":"stop"}],
 "usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,
  "prompt_tokens_details":{"cached_tokens":3,"audio_tokens":0},
  "completion_tokens_details":{"reasoning_tokens":4,"audio_tokens":0}}}`

	chatSSE = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n" +
		"data: [DONE]\n\n"

	responsesSSE = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"status\":\"completed\"," +
		"\"usage\":{\"input_tokens\":36,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":87,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":123}}}\n\n"

	anthropicSSE = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude\",\"stop_reason\":null," +
		"\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":50,\"output_tokens\":1}}}\r\n\r\n" +
		"event: content_block_start\r\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\r\n\r\n" +
		"event: ping\r\ndata: {\"type\": \"ping\"}\r\n\r\n" +
		"event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\r\n\r\n" +
		"event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":8}}\r\n\r\n" +
		"event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":15}}\r\n\r\n" +
		"event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n"

	anthropicJSON = `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],
 "model":"claude","stop_reason":"end_turn","usage":{"input_tokens":2095,"output_tokens":503,
 "cache_creation_input_tokens":0,"cache_read_input_tokens":1000}}`

	embeddingsJSON = `{"object":"list","data":[{"object":"embedding","embedding":[0.0023,-0.0093,1e-3],"index":0}],
 "model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`
)

// feed gives s the body in random pieces.
func feed(s *Scanner, body string, rng *rand.Rand) {
	b := []byte(body)
	for len(b) > 0 {
		n := 1 + rng.IntN(min(len(b), 7))
		s.Write(b[:n])
		b = b[n:]
	}
}

func TestScannerReadsUsage(t *testing.T) {
	for _, c := range []struct {
		name, ctype, body string
		api               API
		want              Usage
		tokens            int64
	}{
		{"chat", "application/json", chatJSON, OpenAI, Usage{19, 10, 29, 3, 4, -1, -1}, 29},
		{"chat stream", "text/event-stream; charset=utf-8", chatSSE, OpenAI, Usage{9, 2, 11, -1, -1, -1, -1}, 11},
		{"responses stream", "text/event-stream", responsesSSE, OpenAI, Usage{36, 87, 123, 0, 0, -1, -1}, 123},
		{"anthropic stream", "text/event-stream", anthropicSSE, Anthropic, Usage{25, 15, -1, -1, -1, 100, 50}, 25 + 15 + 100 + 50},
		{"anthropic", "application/json", anthropicJSON, Anthropic, Usage{2095, 503, -1, -1, -1, 0, 1000}, 2095 + 503 + 1000},
		{"embeddings", "application/json", embeddingsJSON, OpenAI, Usage{8, -1, 8, -1, -1, -1, -1}, 8},
		{"no total", "application/json", `{"usage":{"prompt_tokens":5,"completion_tokens":6}}`, OpenAI, Usage{5, 6, -1, -1, -1, -1, -1}, 11},
		{"huge", "application/json", `{"usage":{"total_tokens":99999999999999999999999999999999999999999999999999}}`, OpenAI, Usage{-1, -1, MaxCount, -1, -1, -1, -1}, MaxCount},
		{"int64 max", "application/json", `{"usage":{"total_tokens":9223372036854775807}}`, OpenAI, Usage{-1, -1, MaxCount, -1, -1, -1, -1}, MaxCount},
	} {
		t.Run(c.name, func(t *testing.T) {
			for seed := range uint64(20) {
				s := NewScanner(c.ctype, "")
				feed(s, c.body, rand.New(rand.NewPCG(seed, 1)))
				if s.Usage() != c.want {
					t.Fatalf("seed %d: %+v, want %+v", seed, s.Usage(), c.want)
				}
				if n, ok := s.Tokens(c.api, Total); !ok || n != c.tokens {
					t.Fatalf("tokens %d %v, want %d", n, ok, c.tokens)
				}
			}
		})
	}
}

func TestScannerReportsNothing(t *testing.T) {
	for _, c := range []struct{ name, ctype, encoding, body string }{
		{"stream without usage", "text/event-stream", "", strings.ReplaceAll(chatSSE, `"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}`, `"usage":null`)},
		{"gzip", "application/json", "gzip", chatJSON},
		{"text", "text/plain", "", chatJSON},
		{"usage deeper", "application/json", "", `{"choices":[{"usage":{"total_tokens":5}}],"x":{"usage":{"total_tokens":5}}}`},
		{"not a count", "application/json", "", `{"usage":{"total_tokens":"5","prompt_tokens":true,"completion_tokens":null}}`},
		{"a comment line", "text/event-stream", "", ": data: {\"usage\":{\"total_tokens\":5}}\n\n"},
	} {
		s := NewScanner(c.ctype, c.encoding)
		s.Write([]byte(c.body))
		if _, ok := s.Tokens(OpenAI, Total); ok {
			t.Errorf("%s: reported %+v", c.name, s.Usage())
		}
	}
	// An Anthropic stream cut after message_start has not reported its
	// output: its usage is not known.
	s := NewScanner("text/event-stream", "")
	s.Write([]byte(anthropicSSE[:strings.Index(anthropicSSE, "event: message_delta")]))
	if n, ok := s.Tokens(Anthropic, Total); ok || s.Usage().Input != 25 {
		t.Errorf("cut after message_start: %d %v (%+v)", n, ok, s.Usage())
	}
}

// TestScannerBounded: a scanner is a fixed size and allocates nothing
// while it reads, whatever the body (a long stream, long keys and
// strings, deep nesting).
func TestScannerBounded(t *testing.T) {
	if n := unsafe.Sizeof(Scanner{}); n > 512 {
		t.Errorf("a Scanner is %d bytes", n)
	}
	chunk := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 4096) + "\"}}],\"" +
		strings.Repeat("k", 100) + "\":[[[[[[[[[[1,2,3]]]]]]]]]],\"usage\":null}\n\n")
	s := NewScanner("text/event-stream", "")
	allocs := testing.AllocsPerRun(1000, func() { s.Write(chunk) })
	if allocs != 0 {
		t.Errorf("%v allocations a chunk", allocs)
	}
	s.Write([]byte(chatSSE))
	if n, _ := s.Tokens(OpenAI, Total); n != 11 {
		t.Errorf("after 1000 chunks: %d tokens", n)
	}
}

func TestParseCount(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "5": 5, "5.0": 5, "5.1": 6, "1e3": 1000, "1.5e1": 15, "1.25e1": 13, "5e-3": 1, "0e-5": 0, "0.0": 0,
		"-3": 0, "-0": 0, "1e400": MaxCount, "123456789012345678901234567890": MaxCount, "1000000000001": MaxCount,
	} {
		if got, ok := parseCount([]byte(in)); !ok || got != want {
			t.Errorf("%s: %d %v, want %d", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "-", "1.", ".5", "1e", "1x", "0x10", "NaN"} {
		if got, ok := parseCount([]byte(in)); ok {
			t.Errorf("%q: read as %d", in, got)
		}
	}
}

func TestReadRequest(t *testing.T) {
	for _, c := range []struct {
		name       string
		api        API
		path, body string
		extra      int64 // the bound beyond the body's length; -1: none
		stream     bool
	}{
		{"chat", OpenAI, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":100}`, 100, false},
		{"largest of two", OpenAI, "/v1/chat/completions", `{"max_tokens":10,"max_completion_tokens":300,"messages":[]}`, 300, false},
		{"repeated", OpenAI, "/v1/chat/completions", `{"max_tokens":10,"max_tokens":3000}`, 3000, false},
		{"n choices", OpenAI, "/v1/chat/completions", `{"max_tokens":10,"n":4}`, 40, false},
		{"best_of", OpenAI, "/v1/completions", `{"prompt":"x","max_tokens":10,"best_of":5,"n":2}`, 50, false},
		{"as a string", OpenAI, "/v1/chat/completions", `{"max_tokens":"70"}`, 70, false},
		{"as a float", OpenAI, "/v1/chat/completions", `{"max_tokens":7e1}`, 70, false},
		{"huge", OpenAI, "/v1/chat/completions", `{"max_tokens":1e30}`, MaxCount, false},
		{"responses", OpenAI, "/v1/responses", `{"input":"hi","max_output_tokens":64,"stream":true}`, 64, true},
		{"embeddings", OpenAI, "/v1/embeddings", `{"input":["a","b"],"model":"e"}`, 0, false},
		{"anthropic", Anthropic, "/v1/messages", `{"model":"c","max_tokens":1024,"messages":[],"stream":true}`, 1024, true},
		{"anthropic ignores OpenAI's names", Anthropic, "/v1/messages", `{"max_completion_tokens":5}`, -1, false},
		{"none", OpenAI, "/v1/chat/completions", `{"messages":[]}`, -1, false},
		{"null", OpenAI, "/v1/chat/completions", `{"max_tokens":null}`, -1, false},
		{"not a number", OpenAI, "/v1/chat/completions", `{"max_tokens":10,"max_completion_tokens":"lots"}`, -1, false},
		{"n not a number", OpenAI, "/v1/chat/completions", `{"max_tokens":10,"n":[]}`, -1, false},
		{"stored input", OpenAI, "/v1/responses", `{"max_output_tokens":10,"previous_response_id":"resp_1"}`, -1, false},
		{"stored conversation", OpenAI, "/v1/responses", `{"max_output_tokens":10,"conversation":{"id":"c"}}`, -1, false},
		{"not an object", OpenAI, "/v1/chat/completions", `[{"max_tokens":10}]`, -1, false},
		{"cut short", OpenAI, "/v1/chat/completions", `{"max_tokens":10,"messages":[`, -1, false},
		{"two objects", OpenAI, "/v1/chat/completions", `{"max_tokens":10} {"max_tokens":10}`, -1, false},
	} {
		r := ReadRequest(c.api, c.path, []byte(c.body))
		if c.extra < 0 {
			if r.Bounded || r.Why == "" {
				t.Errorf("%s: %+v, want no bound", c.name, r)
			}
			continue
		}
		want := min(int64(len(c.body))+c.extra, MaxCount)
		if !r.Bounded || r.Bound != want || r.Stream != c.stream {
			t.Errorf("%s: %+v, want a bound of %d", c.name, r, want)
		}
	}
}

func TestAskUsage(t *testing.T) {
	body := []byte(` {"model":"m","stream":true,"max_tokens":5}`)
	r := ReadRequest(OpenAI, "/v1/chat/completions", body)
	if !r.Stream || r.StreamOptions {
		t.Fatalf("%+v", r)
	}
	out := AskUsage(body)
	if want := ` {"stream_options":{"include_usage":true},"model":"m","stream":true,"max_tokens":5}`; string(out) != want {
		t.Errorf("%s", out)
	}
	r = ReadRequest(OpenAI, "/v1/chat/completions", out)
	if !r.StreamOptions || !bytes.Contains(out, []byte(`"include_usage":true`)) {
		t.Errorf("%+v", r)
	}
	if r := ReadRequest(OpenAI, "/v1/chat/completions", []byte(`{"stream":true,"stream_options":null,"max_tokens":1}`)); !r.StreamOptions {
		t.Errorf("a null stream_options: %+v", r)
	}
}

// TestParts: input and output counted apart, from the usage and from
// the request; a part's bound stands without the other's.
func TestParts(t *testing.T) {
	u := Usage{25, 15, -1, -1, -1, 100, 50}
	for _, c := range []struct {
		api  API
		part Part
		want int64
	}{{Anthropic, Input, 175}, {Anthropic, Output, 15}, {Anthropic, Total, 190}, {OpenAI, Input, 25}, {OpenAI, Output, 15}} {
		if n, ok := u.Part(c.api, c.part); !ok || n != c.want {
			t.Errorf("%s %q: %d %v, want %d", c.api, c.part, n, ok, c.want)
		}
	}
	body := `{"messages":[],"max_tokens":10,"n":3}`
	r := ReadRequest(OpenAI, "/v1/chat/completions", []byte(body))
	if n, why := r.Part(Input); n != int64(len(body)) || why != "" {
		t.Errorf("input: %d %q", n, why)
	}
	if n, why := r.Part(Output); n != 30 || why != "" {
		t.Errorf("output: %d %q", n, why)
	}
	r = ReadRequest(OpenAI, "/v1/chat/completions", []byte(`{"messages":[]}`))
	if n, why := r.Part(Input); n != 15 || why != "" {
		t.Errorf("input without a maximum: %d %q", n, why)
	}
	if n, why := r.Part(Output); n != -1 || why == "" {
		t.Errorf("output without a maximum: %d %q", n, why)
	}
	r = ReadRequest(OpenAI, "/v1/responses", []byte(`{"max_output_tokens":7,"previous_response_id":"r"}`))
	if n, why := r.Part(Output); n != 7 || why != "" {
		t.Errorf("output of a stored conversation: %d %q", n, why)
	}
	if n, why := r.Part(Input); n != -1 || why == "" {
		t.Errorf("input of a stored conversation: %d %q", n, why)
	}
	for in, ok := range map[string]bool{"openai": true, "anthropic:input": true, "openai:output": true, "openai:": false, "openai:total": false, "gemini": false, "": false} {
		if _, _, got := ParseName(in); got != ok {
			t.Errorf("ParseName(%q): %v", in, got)
		}
	}
}

// FuzzScanner: whatever the body, a scanner never panics, and reads the
// same usage whether the body comes whole or in two pieces split
// anywhere; ReadRequest never panics either.
func FuzzScanner(f *testing.F) {
	for _, b := range []string{chatJSON, chatSSE, responsesSSE, anthropicSSE, anthropicJSON, embeddingsJSON} {
		f.Add([]byte(b), uint16(len(b)/2), true)
		f.Add([]byte(b), uint16(len(b)/3), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, cut uint16, sse bool) {
		ctype := "application/json"
		if sse {
			ctype = "text/event-stream"
		}
		whole := NewScanner(ctype, "")
		whole.Write(body)
		parts := NewScanner(ctype, "")
		i := min(int(cut), len(body))
		parts.Write(body[:i])
		parts.Write(body[i:])
		if whole.Usage() != parts.Usage() || whole.final != parts.final {
			t.Fatalf("split at %d: %+v, whole %+v", i, parts.Usage(), whole.Usage())
		}
		ReadRequest(OpenAI, "/v1/chat/completions", body)
		ReadRequest(Anthropic, "/v1/messages", body)
	})
}
