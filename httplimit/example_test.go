package httplimit_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// The middleware in front of any handler: a per-API-key token bucket of
// 1 request per second with bursts of 2, in the memory store.
func Example() {
	set, err := rules.Parse([]byte(`{"rules": [
		{"name": "per-key", "limit_keys": ["header:x-api-key"],
		 "algorithm_config": {"rps": 1, "burst": 2}}]}`), "rules.json")
	if err != nil {
		log.Fatal(err)
	}
	store := memstore.New()
	defer store.Close()
	lim := httplimit.New(store, set)
	defer lim.Close()

	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello\n") })
	srv := httptest.NewServer(lim.Handler(api))
	defer srv.Close()

	for range 3 {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-Api-Key", "k1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		res.Body.Close()
		fmt.Println(res.StatusCode, res.Header.Get("RateLimit-Policy"), res.Header.Get("RateLimit-Remaining"))
	}
	// Output:
	// 200 "per-key";q=2;w=2 1
	// 200 "per-key";q=2;w=2 0
	// 429 "per-key";q=2;w=2 0
}

// Decide answers without writing a response, for handlers that answer
// over-limit requests their own way.
func ExampleLimiter_Decide() {
	set, _ := rules.Parse([]byte(`{"rules": [{"name": "all", "limit_keys": ["global"],
		"algorithm_config": {"rate": 1, "period": "1m", "burst": 1}}]}`), "rules.json")
	lim := httplimit.New(memstore.New(), set)
	defer lim.Close()
	for range 2 {
		res := lim.Decide(context.Background(), httptest.NewRequest("GET", "/", nil))
		if res.Allowed {
			fmt.Println("allowed")
		} else {
			fmt.Println(res.Status, res.Reason, "rule", res.Top.Rule.Name)
		}
	}
	// Output:
	// allowed
	// 429 token_bucket_exceeded rule all
}
