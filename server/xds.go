package server

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/server/envoy"
	"github.com/driplimit/drip/server/envoy/xds"
)

// Envoy's configuration from an xDS server (Config.XDS), as
// envoyproxy/ratelimit takes it under CONFIG_TYPE=GRPC_XDS_SOTW: each
// snapshot is parsed as a reload parses files and swapped in whole, on the
// Envoy service's config-swap entry point (envoy.Service.Swap), so that
// calls already deciding finish on the old one and buckets keep their
// state; a snapshot that does not parse is refused (NACK) and the one in
// force stays. Until a first snapshot applies, Serve does not serve,
// unless Config.XDSForceStart; then ShouldRateLimit answers UNAVAILABLE
// until one does, as envoyproxy/ratelimit answers an error with no
// configuration loaded.

// errNoConfig is the answer of ShouldRateLimit before the first snapshot.
var errNoConfig = status.Error(codes.Unavailable, "drip: no rate limit configuration loaded yet (waiting for the xDS server)")

// checkXDS refuses an xDS server beside rules files (in New, first).
func (c Config) checkXDS() error {
	if c.XDS != nil && c.Rules != "" {
		return errors.New("server: the Envoy configuration comes from an xDS server (CONFIG_TYPE=GRPC_XDS_SOTW) and --rules names files: give one")
	}
	return nil
}

// addXDS makes the xDS client (in New).
func (s *Server) addXDS() error {
	s.envoyService()
	c := *s.cfg.XDS
	if c.Logger == nil {
		c.Logger = s.log
	}
	cl, err := xds.New(c, s.applyXDS)
	if err != nil {
		return err
	}
	s.xds = cl
	return nil
}

// applyXDS takes one snapshot: parsed with Config.Envoy's settings, as a
// reload parses files, then swapped in; an error leaves the configuration
// in force.
func (s *Server) applyXDS(version string, files []envoy.File) error {
	s.rs.mu.Lock()
	defer s.rs.mu.Unlock()
	cfg, err := envoy.ParseWith(s.cfg.Envoy, files...)
	if err == nil {
		err = checkEnvoyHeld(cfg, s.store.Caps())
	}
	if err != nil {
		s.metrics.reloads.WithLabelValues("error").Inc()
		s.metrics.rulesOK.Set(0)
		return err
	}
	s.rs.envoy = cfg
	s.rls.Swap(cfg)
	s.xdsLoaded.Store(true)
	s.rs.loadedAt = time.Now()
	s.metrics.expect(s.rules(), cfg)
	s.metrics.reloads.WithLabelValues("ok").Inc()
	s.metrics.rulesOK.Set(1)
	s.metrics.reloadTime.Set(float64(s.rs.loadedAt.UnixNano()) / 1e9)
	if n := s.metrics.envoyN; n == 0 {
		// Applied, as envoyproxy/ratelimit applies it, but never
		// silently: a control plane that lost its policies looks so.
		s.log.Warn("drip serve: the xDS server's configuration holds no limits: every request is OK until a snapshot with limits applies (drip_envoy_limits_loaded 0)", "version", version, "resources", len(files))
	} else {
		s.log.Info("drip serve: Envoy configuration from the xDS server", "version", version, "domains", len(cfg.Domains()), "limits", n)
	}
	return nil
}

// startXDS runs the xDS client on bg (until the shutdown) and, unless
// Config.XDSForceStart, waits for its first snapshot; false when ctx
// ended first.
func (s *Server) startXDS(ctx, bg context.Context, wg *sync.WaitGroup) bool {
	if s.xds == nil {
		return true
	}
	wg.Go(func() { s.xds.Run(bg) })
	if s.cfg.XDSForceStart {
		return true
	}
	s.log.Info("drip serve: waiting for a first Envoy configuration from the xDS server before serving (FORCE_START_WITHOUT_INITIAL_CONFIG=true serves at once)", "server", s.cfg.XDS.Server)
	select {
	case <-s.xds.Applied():
		return true
	case <-ctx.Done():
		return false
	}
}

// xdsGate answers ShouldRateLimit UNAVAILABLE until a first snapshot has
// applied.
func (s *Server) xdsGate(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if !s.xdsLoaded.Load() && info.FullMethod == "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" {
		return nil, errNoConfig
	}
	return next(ctx, req)
}

// healthHandler is envoyproxy/ratelimit's PORT (Config.HealthListen):
// /healthcheck, and nothing else.
func (s *Server) healthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthcheck", s.healthcheck)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, "drip serves only /healthcheck here\n")
	})
	return mux
}

// HealthAddr is the address of Config.HealthListen, once bound; nil
// before or when it is off.
func (s *Server) HealthAddr() net.Addr { return s.addr("health") }
