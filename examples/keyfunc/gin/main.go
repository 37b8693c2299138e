// Command gin runs drip's key-function middleware in a gin engine. Gin's
// middleware is a gin.HandlerFunc, not a func(http.Handler) http.Handler,
// so ginMiddleware runs the limiter around c.Next and stops the chain
// when the limiter answered by itself. Each API key gets 10 requests a
// minute; a request without one is answered 401 by the key function's
// error.
//
//	cd examples/keyfunc/gin && go run .
//	curl -i -H 'X-Api-Key: k1' localhost:8080/hello
//
// The key function reads the *http.Request: read the caller from its
// headers or its context (r.Context()), not from gin's own context values
// (c.Set), which the request does not carry. The example is a module of
// its own, so that gin never becomes a dependency of drip.
package main

import (
	"errors"
	"flag"
	"log"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

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
	h, err := newEngine(store)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s", *addr)
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

// ginMiddleware runs a func(http.Handler) http.Handler as gin middleware.
func ginMiddleware(mw func(http.Handler) http.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		passed := false
		mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			passed = true
			c.Request = r // the request as the middleware passed it on
			c.Next()
		})).ServeHTTP(c.Writer, c.Request)
		if !passed {
			c.Abort() // the limiter answered: 429, 503, or the key error
		}
	}
}

var errNoKey = errors.New("send your API key in X-Api-Key")

// newEngine is the server; opts configure the limiter (the test's clock).
func newEngine(store store.Store, opts ...httplimit.Option) (http.Handler, error) {
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
	gin.SetMode(gin.ReleaseMode)
	g := gin.New()
	g.Use(gin.Recovery())
	g.GET("/health", func(c *gin.Context) { c.String(http.StatusOK, "ok\n") })
	api := g.Group("/", ginMiddleware(lim.Handler)) // only the API is limited
	api.GET("/hello", func(c *gin.Context) { c.String(http.StatusOK, "hello\n") })
	return g, nil
}
