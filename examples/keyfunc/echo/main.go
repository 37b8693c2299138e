// Command echo runs drip's key-function middleware in an echo server:
// echo.WrapMiddleware takes a func(http.Handler) http.Handler, which
// KeyLimiter.Handler is. Each API key gets 10 requests a minute; a request
// without one is answered 401 by the key function's error.
//
//	cd examples/keyfunc/echo && go run .
//	curl -i -H 'X-Api-Key: k1' localhost:8080/hello
//
// The key function reads the *http.Request: read the caller from its
// headers or its context (r.Context()), not from echo's own context values
// (c.Set), which the request does not carry. The example is a module of
// its own, so that echo never becomes a dependency of drip.
package main

import (
	"errors"
	"flag"
	"log"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

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
	h, err := newServer(store)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s", *addr)
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

var errNoKey = errors.New("send your API key in X-Api-Key")

// newServer is the server; opts configure the limiter (the test's clock).
func newServer(store store.Store, opts ...httplimit.Option) (http.Handler, error) {
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
	e := echo.New()
	e.Use(middleware.Recover())
	e.GET("/health", func(c echo.Context) error { return c.String(http.StatusOK, "ok\n") })
	api := e.Group("", echo.WrapMiddleware(lim.Handler)) // only the API is limited
	api.GET("/hello", func(c echo.Context) error { return c.String(http.StatusOK, "hello\n") })
	return e, nil
}
