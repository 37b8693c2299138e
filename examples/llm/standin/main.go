// Command standin serves the example's stand-in upstream (package
// upstream: streamed chat completions that report their tokens in the
// X-Usage-Total-Tokens trailer), to try examples/llm/rules.yaml by hand:
//
//	go run ./examples/llm/standin --listen 127.0.0.1:8000
//	go run ./cmd/drip serve --upstream http://127.0.0.1:8000 --rules examples/llm/rules.yaml
//	curl -N localhost:8080/v1/chat/completions -H 'X-Tenant: acme' -H 'X-Test-Completion-Tokens: 5' -d '{}'
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
	log.Printf("stand-in upstream on http://%s/v1/chat/completions", *listen)
	log.Fatal(srv.ListenAndServe())
}
