// Command standin serves the example's stand-in model server (package
// upstream: OpenAI's Chat Completions and Anthropic's Messages, streamed
// or not, with their usage), to try examples/llm/rules.yaml by hand as
// examples/llm/README.md shows.
package main

import (
	"flag"
	"log"
	"net/http"
	"time"

	"github.com/driplimit/drip/examples/llm/upstream"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8000", "address to serve on")
	flag.Parse()
	srv := &http.Server{Addr: *listen, Handler: upstream.Handler(), ReadHeaderTimeout: 10 * time.Second}
	log.Printf("stand-in model server on http://%s (/v1/chat/completions, /v1/messages)", *listen)
	log.Fatal(srv.ListenAndServe())
}
