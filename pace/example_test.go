package pace_test

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip/pace"
)

// A client of an API that allows two requests an hour, and says so in
// GitHub-style headers: the third request is not sent, since it would wait
// longer than MaxWait.
func Example() {
	var n atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		left := 2 - n.Add(1)
		w.Header().Set("X-RateLimit-Limit", "2")
		w.Header().Set("X-RateLimit-Remaining", strconv.FormatInt(max(left, 0), 10))
		w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10))
		if left < 0 {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer api.Close()

	client := &http.Client{Transport: pace.New(nil, pace.WithMaxWait(time.Minute))}
	for range 3 {
		resp, err := client.Get(api.URL)
		if errors.Is(err, pace.ErrWaitTooLong) {
			fmt.Println("not sent: no more requests this hour")
			continue
		}
		if err != nil {
			fmt.Println(err)
			continue
		}
		resp.Body.Close()
		fmt.Println(resp.Status)
	}
	// Output:
	// 200 OK
	// 200 OK
	// not sent: no more requests this hour
}

// Pacing per API token rather than per host, for a server that limits
// each token on its own. Keys show in errors: the token is hashed.
func ExampleWithKey() {
	perToken := func(r *http.Request) string {
		return fmt.Sprintf("%s %x", r.URL.Host, sha256.Sum256([]byte(r.Header.Get("Authorization"))))
	}
	client := &http.Client{Transport: pace.New(nil, pace.WithKey(perToken))}
	_ = client
}
