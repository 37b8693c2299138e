package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
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
			fmt.Println(httplimit.Status(res), res.Reason, "rule", res.Top.Rule.Name)
		}
	}
	// Output:
	// allowed
	// 429 token_bucket_exceeded rule all
}

type userKey struct{}

// withUser stands for an authentication middleware: it puts the user a
// session names in the request's context.
func withUser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u := r.Header.Get("X-Session"); u != "" { // look the session up, verify the token, ...
			r = r.WithContext(context.WithValue(r.Context(), userKey{}, u))
		}
		next.ServeHTTP(w, r)
	})
}

// A limit per user without a rules file: the key function reads the user
// that the authentication middleware put in the context. Requests
// without a user have no key and are not limited.
func ExampleNewKeyLimiter() {
	store := memstore.New()
	defer store.Close()
	lim, err := httplimit.NewKeyLimiter(store, httplimit.KeyLimit{
		Name:  "per-user",
		Limit: drip.PerMinute(60).WithBurst(2),
		Key: func(r *http.Request) (string, error) {
			user, _ := r.Context().Value(userKey{}).(string)
			return user, nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()

	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello\n") })
	h := withUser(lim.Handler(api)) // the limiter runs after authentication

	for _, user := range []string{"ann", "ann", "ann", "bob", ""} {
		req := httptest.NewRequest("GET", "/", nil)
		if user != "" {
			req.Header.Set("X-Session", user)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Printf("%-3s %d %q %q\n", user, rec.Code, rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit-Remaining"))
	}
	// Output:
	// ann 200 "\"per-user\";q=2;w=2" "1"
	// ann 200 "\"per-user\";q=2;w=2" "0"
	// ann 429 "\"per-user\";q=2;w=2" "0"
	// bob 200 "\"per-user\";q=2;w=2" "1"
	//     200 "" ""
}

// A cost per request, and a 401 of the program's own when the key
// function fails.
func ExampleKeyLimit_cost() {
	store := memstore.New()
	defer store.Close()
	lim, err := httplimit.NewKeyLimiter(store, httplimit.KeyLimit{
		Name:  "per-key",
		Limit: drip.PerHour(100),
		Key: func(r *http.Request) (string, error) {
			if k := r.Header.Get("X-Api-Key"); k != "" {
				return k, nil
			}
			return "", errors.New("no API key")
		},
		// A batch of n items costs n.
		Cost: func(r *http.Request) float64 {
			n, _ := engine.ParseCost(r.URL.Query().Get("items"))
			return max(n, 1)
		},
		KeyError: func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, err.Error(), http.StatusUnauthorized)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, target := range []string{"/?items=40", "/?items=50", "/?items=20", "/"} {
		req := httptest.NewRequest("POST", target, nil)
		req.Header.Set("X-Api-Key", "k1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(target, rec.Code, rec.Header().Get("RateLimit-Remaining"))
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/", nil))
	fmt.Print(rec.Code, " ", rec.Body.String())
	// Output:
	// /?items=40 200 60
	// /?items=50 200 10
	// /?items=20 429 10
	// / 200 9
	// 401 no API key
}
