package server

import (
	"net/http"
	"time"
)

// The drain: when Serve's context ends (SIGTERM), the server keeps
// serving for Config.Drain before it shuts down, so that no client loses
// a request to the shutdown. http.Server.Shutdown closes the keep-alive
// connections that are idle, and a client that sent its next request on
// one just then gets EOF or a reset instead of an answer (net/http's
// client retries only idempotent requests; a POST fails). While draining,
// every HTTP response says "Connection: close": a client sending on a
// keep-alive connection learns with its next answer to open a new one,
// which serves one request and closes, and load balancers, told by the
// readiness checks that the server is going, stop opening them. When the
// drain ends no connection the server kept alive is left for Shutdown to
// close under a client; a new connection may then be refused, which a
// client or load balancer can retry elsewhere.

// drain begins the drain of ls and returns when Config.Drain has passed
// or EndDrain was called; at once without a drain (Config.Drain < 0).
func (s *Server) drain(ls []*listener) {
	if s.cfg.Drain < 0 {
		return
	}
	s.draining.Store(true)
	for _, l := range ls {
		if l.drain != nil {
			l.drain()
		}
	}
	s.log.Info("drip serve: draining: every answer closes its connection, /readyz answers 503 (a second SIGTERM or SIGINT ends it)", "for", s.cfg.Drain.String())
	t := time.NewTimer(s.cfg.Drain)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.endDrain:
	}
}

// EndDrain ends the drain at once, if the server drains or when it
// begins to: Serve then shuts down. It may be called more than once.
func (s *Server) EndDrain() {
	s.endDrainNow.Do(func() { close(s.endDrain) })
}

// closing makes every response of h close its connection once the server
// drains. (HTTP/2 would send GOAWAY for it; drip serves HTTP/1.1.)
func (s *Server) closing(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}
