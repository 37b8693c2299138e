// Command nethttp runs drip's key-function middleware in front of a
// net/http server, without a rules file: each user gets 5 requests a
// second with bursts of 10, and requests without a user are limited by
// client IP, 1 a second with bursts of 5.
//
//	go run ./examples/keyfunc/nethttp
//	curl -i -H 'Authorization: Bearer ann' localhost:8080/hello
//
// The user is whoever the bearer token names: a stand-in for a real
// authentication middleware, which verifies the token and puts the user
// in the request's context, where the key function reads it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "address to listen on")
	flag.Parse()
	// memstore keeps the buckets in this process; a PostgreSQL or Redis
	// store (store/pgstore, store/redisstore) shares them between
	// instances.
	store := memstore.New()
	defer store.Close()
	h, err := newHandler(store)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s", *addr)
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

type userKey struct{}

// authenticate puts the user of the request's bearer token in its
// context. It verifies nothing: a real program checks the token here.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && user != "" {
			r = r.WithContext(context.WithValue(r.Context(), userKey{}, user))
		}
		next.ServeHTTP(w, r)
	})
}

// newHandler is the server: authentication, then the two limits, then
// the application. opts configure the limiters (the test's clock).
func newHandler(store store.Store, opts ...httplimit.Option) (http.Handler, error) {
	perUser, err := httplimit.NewKeyLimiter(store, httplimit.KeyLimit{
		Name:  "per-user",
		Limit: drip.PerSecond(5).WithBurst(10),
		Key: func(r *http.Request) (string, error) {
			user, _ := r.Context().Value(userKey{}).(string)
			return user, nil // "": no user, not limited here
		},
	}, opts...)
	if err != nil {
		return nil, err
	}
	anonymous, err := httplimit.NewKeyLimiter(store, httplimit.KeyLimit{
		Name:  "anonymous",
		Limit: drip.PerSecond(1).WithBurst(5),
		Key: func(r *http.Request) (string, error) {
			if r.Context().Value(userKey{}) != nil {
				return "", nil // a user: limited by per-user instead
			}
			ip, ok := httplimit.ClientIP(r, nil) // behind a proxy, pass its address
			if !ok {
				return "unknown", nil
			}
			return httplimit.KeyIP(ip, 64), nil
		},
	}, opts...)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		user, _ := r.Context().Value(userKey{}).(string)
		fmt.Fprintf(w, "hello %s\n", user)
	})
	return authenticate(perUser.Handler(anonymous.Handler(mux))), nil
}
