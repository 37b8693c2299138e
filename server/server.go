// Package server is drip serve: the decision API (or, with an upstream,
// the gateway), and an admin listener with Prometheus metrics, health
// checks and the admin API (inspect and reset buckets, reload rules, set
// per-tenant overrides: overrides.go).
//
// A Server is built from a Config and an open store.Store. Listen binds its
// listeners (so that port 0 resolves before anyone connects), Serve runs
// them until its context ends, drains (Config.Drain) and then shuts down
// gracefully; Run does both.
//
// Rules reload on Reload (which the admin API, SIGHUP in cmd/drip and the
// file watcher call): the new rules are loaded and validated aside and
// swapped in as one immutable snapshot; a bad file keeps the rules in
// force, and is logged and counted (drip_rules_reloads_total{result="error"},
// drip_rules_last_reload_ok 0). Bucket keys depend on the rule name and the
// key values only, so buckets keep their state across reloads.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/internal/conncap"
	"github.com/driplimit/drip/internal/door/local"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/server/envoy"
	"github.com/driplimit/drip/server/envoy/xds"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/topkeys"
)

// timeZero asks a store for a decision on its own clock.
var timeZero time.Time

// Server is drip serve. Construct it with New; it is safe for concurrent
// use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	store   store.Store      // instrumented
	eng     *engine.Engine   // every front door's: one deadline, one breaker, one observer
	who     *topkeys.Tracker // who is being limited (who.go)
	// The store's board, nil when it keeps none, where the instance puts
	// its top keys' summaries under its name, for topTTL (who.go).
	board    store.Board
	instance string
	topTTL   time.Duration

	rs  *ruleState
	lim *httplimit.Limiter // the rules on HTTP requests: the gateway's middleware, forward auth
	rls *envoy.Service     // Envoy's rate limit service; nil without GRPCListen
	// xds follows the xDS server of Config.XDS (xds.go); xdsLoaded is
	// set once a first snapshot applied.
	xds       *xds.Client
	xdsLoaded atomic.Bool

	// Per-tenant overrides (overrides.go): the store's, nil when it keeps
	// none; the follower that keeps eng's snapshot of them current; its
	// options (tests: the poll interval, no notifications).
	ost     store.Overrides
	ovr     *override.Follower
	ovrOpts []override.Option
	stale   staleOverrides // stale.go

	slots heldSlots // the adaptive rules' slots held through /v1/acquire (slots.go)

	mu        sync.Mutex
	listeners []*listener
	served    bool

	// draining is set when the drain begins (drain.go); endDrain, closed
	// by EndDrain, ends it early.
	draining    atomic.Bool
	endDrain    chan struct{}
	endDrainNow sync.Once

	// Tests set these before Serve to drive the rules watcher: it polls
	// once per value of watchTick instead of every Config.WatchEvery, and
	// calls watchPolled after each poll.
	watchTick   <-chan time.Time
	watchPolled func()
	// serving, if set before Serve, is called once Serve has started all
	// it runs (the watcher, the overrides' follower, the listeners), so
	// that tests count goroutines from there.
	serving func()
}

// listener is one endpoint of the server: its address, the bound socket,
// and how to serve and stop it. A new transport (Envoy's gRPC service on
// Config.GRPCListen) is one more listener, added in New.
type listener struct {
	name     string // "api", "gateway", "admin", "grpc": for logs
	addr     string
	ln       net.Listener
	capped   *conncap.Listener // ln under Config.MaxConnections, once served; nil for grpc
	serve    func(net.Listener) error
	drain    func() // when the drain begins; nil for HTTP (closing)
	shutdown func(context.Context) error
}

// New returns a server for cfg with state in store. It loads the rules
// (Config.Rules, or the built-in default) and fails if they are not valid.
// The caller keeps ownership of store and closes it after Serve returns.
func New(cfg Config, st store.Store) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.checkXDS(); err != nil { // xds.go
		return nil, err
	}
	if cfg.GRPCTLS != nil && cfg.GRPCListen == "" {
		// TLS guarding no listener: no decision would need a
		// certificate, and the admin listener's POST /json would decide
		// in plaintext.
		return nil, errors.New("GRPCTLS is set but GRPCListen is not: TLS for no gRPC listener guards nothing; give GRPCListen, or drop GRPCTLS")
	}
	if cfg.ClientCertsRequired() && cfg.Listen != "off" {
		what := "decision API"
		if cfg.Upstream != "" {
			what = "gateway"
		}
		return nil, fmt.Errorf("the %s on %s (--listen) would decide for any client in plaintext, beside a gRPC listener that requires client certificates: turn it off (--listen off), or run it in a drip serve of its own", what, cfg.Listen)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, metrics: newMetrics(), endDrain: make(chan struct{})}
	for _, c := range cfg.Collectors {
		if err := s.metrics.reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	s.store = s.metrics.observe(st)
	if cfg.DenialBytes >= 0 && !st.Caps().InProcess {
		// One set of proofs for every front door, and the admin API's
		// resets clear theirs.
		d := store.NewDenials(s.store, store.DenialsOptions{Bytes: cfg.DenialBytes, Stale: cfg.DenialStale})
		s.metrics.denials(d)
		s.store = d
	}
	s.who = s.newTracker()
	s.board, s.instance, s.topTTL = st.Caps().Board, instanceName(), topTTL
	s.metrics.reg.MustRegister(whoCollector{s.who})
	s.eng = engine.New(s.store, engine.WithTimeout(cfg.StoreTimeout), engine.WithLogger(s.log),
		engine.WithObserver(s.metrics.obs), engine.WithName("drip serve"), engine.WithLocal(local.New),
		engine.WithTracerProvider(cfg.TracerProvider), engine.WithKeys(s.who))
	s.metrics.obs.WatchAdaptive(s.eng.Adaptive) // the adaptive rules' learned limits, at each scrape
	s.ost = st.Caps().Overrides
	rs, err := s.loadRules()
	if err != nil {
		return nil, err
	}
	s.rs = rs
	s.lim = httplimit.New(s.store, rs.cur.Load().set, engine.Shared(s.eng))

	front, name := s.apiHandler(), "api"
	if cfg.Upstream != "" {
		front, err = s.gateway()
		if err != nil {
			return nil, err
		}
		name = "gateway"
	}
	if cfg.TracerProvider != nil {
		front = s.traced(front) // trace.go
	}
	if cfg.Listen != "off" {
		s.addHTTP(name, cfg.Listen, front, name != "gateway")
	}
	if cfg.AdminListen != "off" {
		s.addHTTP("admin", cfg.AdminListen, s.adminHandler(), true)
	}
	if cfg.HealthListen != "" {
		s.addHTTP("health", cfg.HealthListen, s.healthHandler(), true) // xds.go
	}
	if cfg.XDS != nil {
		if err := s.addXDS(); err != nil { // xds.go
			return nil, err
		}
	}
	if cfg.GRPCListen != "" {
		s.addGRPC() // Envoy's rate limit service (envoy.go)
	}
	return s, nil
}

// maxHeaderBytes bounds a request's headers on every HTTP listener (the
// request line and header lines together; net/http allows a little
// slack over it). Go's default, 1 MiB, would let a thousand connections
// hold a gigabyte.
const maxHeaderBytes = 64 << 10

// addHTTP adds an HTTP listener serving h on addr, with at most
// Config.MaxConnections connections open at once and headers of at most
// maxHeaderBytes, every response closing its connection while the server
// drains (drain.go). Headers must arrive within 10 s; with whole, the entire
// request (headers and body) within Config.ReadTimeout, else (the
// gateway, whose bodies stream both ways) the request body may stall no
// longer than that (stallCut), nor may the client stop reading the
// response for longer (writeStallCut).
func (s *Server) addHTTP(name, addr string, h http.Handler, whole bool) {
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: min(10*time.Second, s.cfg.ReadTimeout),
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	if whole {
		hs.ReadTimeout = s.cfg.ReadTimeout
	} else {
		hs.Handler = writeStallCut(stallCut(h, s.cfg.ReadTimeout), s.cfg.ReadTimeout)
	}
	hs.Handler = busy(s.closing(hs.Handler), whole)
	hs.ConnContext = conncap.WithConn
	l := &listener{name: name, addr: addr, shutdown: hs.Shutdown}
	l.serve = func(ln net.Listener) error {
		c := conncap.New(ln, s.cfg.MaxConnections).Evict()
		s.mu.Lock()
		l.capped = c
		s.mu.Unlock()
		return hs.Serve(c)
	}
	s.listeners = append(s.listeners, l)
}

// busy marks a connection as serving a request while h runs, so that at
// Config.MaxConnections a new connection closes one that sends nothing or
// idles rather than being closed itself (conncap.Listener.Evict). With
// whole (bodies of at most a few hundred KiB, read at once), a request
// counts as served only once its body has arrived: else connections
// trickling their bodies would shut other clients out until ReadTimeout.
func busy(h http.Handler, whole bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !whole || r.Body == nil || r.Body == http.NoBody {
			defer conncap.Busy(r.Context())()
			h.ServeHTTP(w, r)
			return
		}
		b := &arrived{ReadCloser: r.Body, ctx: r.Context()}
		defer b.done()
		// A copy: net/http reads its own request's Body after the handler
		// to tell whether the connection can be reused.
		r = r.WithContext(r.Context())
		r.Body = b
		h.ServeHTTP(w, r)
	})
}

// arrived marks its request's connection busy once the body has been
// read to its end.
type arrived struct {
	io.ReadCloser
	ctx    context.Context
	unbusy func()
}

func (b *arrived) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && b.unbusy == nil {
		b.unbusy = conncap.Busy(b.ctx)
	}
	return n, err
}

func (b *arrived) done() {
	if b.unbusy != nil {
		b.unbusy()
	}
}

// Listen binds every listener. Addresses with port 0 get a free port:
// Addr and AdminAddr tell which.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, l := range s.listeners {
		if l.ln != nil {
			continue
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			for _, p := range s.listeners[:i] {
				p.ln.Close()
				p.ln = nil
			}
			if errors.Is(err, syscall.EADDRINUSE) {
				return fmt.Errorf("%s listener: %w (another process listens there: choose another address with %s)", l.name, err, listenFlag[l.name])
			}
			return fmt.Errorf("%s listener: %w", l.name, err)
		}
		l.ln = ln
	}
	return nil
}

// listenFlag names the drip serve flag that sets each listener's address.
var listenFlag = map[string]string{"api": "--listen", "gateway": "--listen", "admin": "--admin-listen", "grpc": "--grpc-listen", "health": "HOST and PORT"}

// Addr is the address of the decision API (or gateway), once Listen has
// bound it; nil before.
func (s *Server) Addr() net.Addr { return s.addr("api", "gateway") }

// AdminAddr is the address of the admin listener, once bound; nil before
// or when it is off.
func (s *Server) AdminAddr() net.Addr { return s.addr("admin") }

func (s *Server) addr(names ...string) net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.listeners {
		for _, n := range names {
			if l.name == n && l.ln != nil {
				return l.ln.Addr()
			}
		}
	}
	return nil
}

// Run binds the listeners and serves until ctx ends; see Serve.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	return s.Serve(ctx)
}

// Serve serves on the listeners (binding any that Listen has not) and
// watches the rules file, until ctx ends or a listener fails. When ctx
// ends, it drains for Config.Drain (drain.go); then it shuts down
// gracefully: listeners stop accepting, and in-flight requests get
// Config.ShutdownTimeout to finish, and requests waiting in a rule's
// queue their wait and then as long (shutdownDeadline). It returns nil
// after a shutdown caused by ctx.
func (s *Server) Serve(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.served {
		s.mu.Unlock()
		return errors.New("server: Serve called twice")
	}
	s.served = true
	ls := append([]*listener(nil), s.listeners...)
	s.mu.Unlock()

	// The rules watcher and the overrides' follower run on through the
	// drain, until the shutdown.
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { s.watch(bg) })
	if s.board != nil {
		wg.Go(func() { s.who.Run(bg, s.putTop) }) // who.go
	} else {
		wg.Go(func() { s.who.Run(bg) })
	}
	if s.ost != nil {
		s.followOverrides(bg, &wg)
	}
	if !s.startXDS(ctx, bg, &wg) { // xds.go: ended before a first configuration
		cancel()
		for _, l := range ls {
			l.ln.Close()
		}
		wg.Wait()
		s.eng.Close()
		return nil
	}

	errc := make(chan error, len(ls))
	for _, l := range ls {
		s.log.Info("drip serve: listening", "listener", l.name, "addr", l.ln.Addr().String())
		go func() {
			if err := l.serve(l.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s listener: %w", l.name, err)
				return
			}
			errc <- nil
		}()
	}
	if s.serving != nil {
		s.serving()
	}

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	if err == nil {
		s.drain(ls) // a listener that failed asks for no drain
	}
	cancel()
	s.log.Info("drip serve: shutting down")
	sctx, scancel := context.WithDeadline(context.Background(), shutdownDeadline(time.Now(), s.eng.WaitsUntil(), s.cfg.ShutdownTimeout))
	defer scancel()
	for _, l := range ls {
		if e := l.shutdown(sctx); e != nil && err == nil {
			err = fmt.Errorf("%s listener shutdown: %w", l.name, e)
		}
	}
	wg.Wait()
	s.eng.Close() // the local fallback of every front door
	return err
}

// shutdownDeadline bounds a graceful shutdown that begins at now: the
// requests in flight get timeout to finish. A request still waiting in
// a rule's queue (max_wait, or the decision API's wait) is not dropped:
// it waits its turn until its wait ends, at waitsUntil (zero: none
// waits), and gets timeout from then, as if it had been in flight when
// the shutdown began.
func shutdownDeadline(now, waitsUntil time.Time, timeout time.Duration) time.Time {
	if waitsUntil.After(now) {
		now = waitsUntil
	}
	return now.Add(timeout)
}
