package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/internal/redact"
	"github.com/driplimit/drip/rules"
)

// gateway returns the reverse proxy to Config.Upstream, behind the rules.
func (s *Server) gateway() (http.Handler, error) {
	u, err := url.Parse(s.cfg.Upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("upstream %q: want an http:// or https:// URL", redact.URL(s.cfg.Upstream))
	}
	tr := &http.Transport{
		Proxy: nil, // the upstream is reached directly, whatever HTTP_PROXY says
		DialContext: (&net.Dialer{
			Timeout:   10 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			forwardHeaders(pr, s.rules().TrustedProxies) // forward.go
			if s.cfg.TracerProvider != nil {
				injectTrace(pr.Out) // trace.go
			}
		},
		Transport:  tr,
		BufferPool: bufferPool{},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if !errors.Is(r.Context().Err(), context.Canceled) {
				// Not when the client went away, which cut the call: a
				// line a hang-up would be the client's to write.
				s.log.Warn("drip serve: upstream failed", "err", err, "path", r.URL.Path)
			}
			httplimit.Errored(w) // not served: the rules that settle on the response take nothing
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintf(w, `{"type":"about:blank","title":"Bad Gateway","status":502,"detail":"upstream unavailable"}`+"\n")
		},
	}
	return s.limit(proxy), nil
}

// limit puts the rules in front of next: the httplimit middleware on the
// server's engine (state in the instrumented store, decisions in the
// metrics), the one forward auth decides with too.
func (s *Server) limit(next http.Handler) http.Handler { return s.lim.Handler(next) }

// swapLimiter hands reloaded rules to the middleware.
func (s *Server) swapLimiter(set *rules.Set) { s.lim.Swap(set) }

// bufferPool recycles the proxy's copy buffers (32 KiB each), which
// httputil.ReverseProxy otherwise allocates per response.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func (bufferPool) Get() []byte { return copyBuffers.Get().(*[32 << 10]byte)[:] }
func (bufferPool) Put(b []byte) {
	if cap(b) == 32<<10 {
		copyBuffers.Put((*[32 << 10]byte)(b[:32<<10]))
	}
}
