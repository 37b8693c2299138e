// Command chi runs drip's key-function middleware on a chi router:
// chi's middleware type is func(http.Handler) http.Handler, which
// KeyLimiter.Handler is, so r.Use takes it as it is. Each API key gets
// 10 requests a minute; a request without one is answered 401 by the
// key function's error.
//
//	cd examples/keyfunc/chi && go run .
//	curl -i -H 'X-Api-Key: k1' localhost:8080/hello
//
// The example is a module of its own, so that chi never becomes a
// dependency of drip.
package main

import (
	"errors"
	"flag"
	"log"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "address to listen on")
	flag.Parse()
	store := memstore.New()
	defer store.Close()
	r, err := newRouter(store)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s", *addr)
	srv := &http.Server{Addr: *addr, Handler: r, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

var errNoKey = errors.New("send your API key in X-Api-Key")

// newRouter is the server; opts configure the limiter (the test's clock).
func newRouter(store store.Store, opts ...httplimit.Option) (http.Handler, error) {
	lim, err := httplimit.NewKeyLimiter(store, httplimit.KeyLimit{
		Name:  "per-api-key",
		Limit: drip.PerMinute(10),
		Key: func(r *http.Request) (string, error) {
			if k := r.Header.Get("X-Api-Key"); k != "" {
				return k, nil
			}
			return "", errNoKey
		},
		KeyError: func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, err.Error(), http.StatusUnauthorized)
		},
	}, opts...)
	if err != nil {
		return nil, err
	}
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Get("/health", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	r.Group(func(r chi.Router) {
		r.Use(lim.Handler) // only the API is limited
		r.Get("/hello", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello\n")) })
	})
	return r, nil
}
