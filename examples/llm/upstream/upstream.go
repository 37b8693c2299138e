// Package upstream is a stand-in for an OpenAI-compatible chat upstream,
// for the example's test: POST /v1/chat/completions streams server-sent
// events, one per completion token, ends with a usage event and
// "data: [DONE]", and reports the total tokens in the
// X-Usage-Total-Tokens trailer, which drip's gateway reads.
//
// Real OpenAI-compatible servers report usage only in the body (the last
// event, with stream_options.include_usage): put a shim beside them that
// copies it into the trailer, as this one does itself.
package upstream

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// Trailer is the trailer that carries the request's total tokens.
const Trailer = "X-Usage-Total-Tokens"

// Handler answers chat completions. The request's X-Test-Prompt-Tokens and
// X-Test-Completion-Tokens headers say how many tokens the answer uses
// (defaults 10 and 20), so that a test knows the usage to expect. It
// stops early, reporting what it used so far, when the client goes away.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		prompt := number(r.Header.Get("X-Test-Prompt-Tokens"), 10)
		completion := number(r.Header.Get("X-Test-Completion-Tokens"), 20)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Trailer", Trailer)
		rc := http.NewResponseController(w)
		sent := 0
		for ; sent < completion; sent++ {
			if r.Context().Err() != nil {
				break
			}
			ev, _ := json.Marshal(map[string]any{"object": "chat.completion.chunk",
				"choices": []any{map[string]any{"index": 0, "delta": map[string]string{"content": "tok "}}}})
			fmt.Fprintf(w, "data: %s\n\n", ev)
			if rc.Flush() != nil {
				break
			}
		}
		total := prompt + sent
		ev, _ := json.Marshal(map[string]any{"object": "chat.completion.chunk", "choices": []any{},
			"usage": map[string]int{"prompt_tokens": prompt, "completion_tokens": sent, "total_tokens": total}})
		fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", ev)
		w.Header().Set(Trailer, strconv.Itoa(total))
	})
	return mux
}

func number(s string, def int) int {
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n <= 1_000_000 {
		return n
	}
	return def
}
