package server

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/server/envoy"
	"github.com/driplimit/drip/server/envoy/xds"
)

// Config holds every setting of drip serve. The zero value is usable: it
// serves the decision API on DefaultListen and the admin endpoints on
// DefaultAdminListen, with the built-in default rules. cmd/drip fills it
// from flags and DRIP_* environment variables.
type Config struct {
	// Listen is the address of the decision API, or of the gateway when
	// Upstream is set (--listen, DRIP_LISTEN). Empty means DefaultListen;
	// "off" turns it off.
	Listen string
	// AdminListen is the address of /metrics, /healthz, /readyz and the
	// admin API (--admin-listen, DRIP_ADMIN_LISTEN). Empty means
	// DefaultAdminListen; "off" disables the admin listener.
	AdminListen string
	// AdminToken guards the admin API: its endpoints answer 401 without
	// "Authorization: Bearer <AdminToken>", and 404 when it is empty
	// (--admin-token, DRIP_ADMIN_TOKEN, or read from the file of
	// --admin-token-file, DRIP_ADMIN_TOKEN_FILE). Metrics and health need
	// no token.
	AdminToken string
	// Rules is the rules file (--rules, DRIP_RULES). Empty means the
	// built-in default rules.
	Rules string
	// Store names the store (--store, DRIP_STORE), for logs and /readyz;
	// the caller opens it and passes it to New.
	Store string
	// Upstream, when set, turns Listen into a gateway: a reverse proxy to
	// this URL that applies the rules to every request (--upstream,
	// DRIP_UPSTREAM).
	Upstream string
	// GRPCListen is the address of Envoy's rate limit service
	// (--grpc-listen, DRIP_GRPC_LISTEN). Empty disables it.
	GRPCListen string
	// GRPCReflection turns on gRPC server reflection on GRPCListen
	// (--grpc-reflection, DRIP_GRPC_REFLECTION); off by default.
	GRPCReflection bool
	// Envoy are the settings of loading envoyproxy/ratelimit files at
	// Rules, which cmd/drip reads from envoyproxy/ratelimit's own
	// environment variables (MERGE_DOMAIN_CONFIG, SHADOW_MODE,
	// RUNTIME_IGNOREDOTFILES). The zero value loads a directory's dotfiles
	// that are envoy files, as envoyproxy/ratelimit does.
	Envoy envoy.Options
	// GRPCLimits bound the connections and calls of GRPCListen's clients;
	// zero fields take envoy.DefaultLimits.
	GRPCLimits envoy.Limits
	// GRPCTLS, when set, serves GRPCListen over TLS (mutual TLS when it
	// asks for client certificates): envoyproxy/ratelimit's
	// GRPC_SERVER_USE_TLS and its files. When it requires client
	// certificates, no other listener decides: New refuses a decision
	// API or gateway (Listen must be "off"), and the admin listener does
	// not serve POST /json (ClientCertsRequired). Without GRPCListen it
	// is refused: it would guard nothing.
	GRPCTLS *tls.Config
	// XDS, when set, takes the Envoy configuration from an xDS server
	// instead of files (CONFIG_TYPE=GRPC_XDS_SOTW; Rules must then be
	// empty); see server/xds.go. Serve waits for its first snapshot
	// before serving unless XDSForceStart
	// (FORCE_START_WITHOUT_INITIAL_CONFIG).
	XDS           *xds.Config
	XDSForceStart bool
	// HealthNeedsConfig makes /healthcheck fail until the xDS server's
	// first snapshot applied (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED);
	// files are loaded before anything is served.
	HealthNeedsConfig bool
	// HealthListen, when set, is envoyproxy/ratelimit's HOST:PORT: a
	// listener that serves /healthcheck and nothing else, for the
	// probes of deployments made for it.
	HealthListen string

	// ReadTimeout bounds the reading of a request (default 30s). On the
	// decision API and the admin listener it is the most time a request,
	// headers and body, may take to arrive; on the gateway, where bodies
	// are streamed to the upstream and may be long, it is the longest the
	// body may stall (no byte arriving) before the request is cut, and the
	// longest the client may stop reading the response (no byte leaving)
	// before its connection is closed. Headers must arrive within 10 s on
	// every listener.
	ReadTimeout time.Duration
	// MaxConnections bounds the connections each HTTP listener (the
	// decision API or gateway, and the admin listener) holds open at once
	// (default DefaultMaxConnections, 1024), so that a client opening many
	// connections cannot make the server hold unbounded memory. One
	// accepted beyond it closes the oldest connection not serving a
	// request (sending its headers, or idle), else it is closed at once:
	// connections that send nothing cannot shut other clients out.
	// GRPCLimits bound GRPCListen.
	MaxConnections int

	// StoreTimeout is the deadline of each store call, in every front door
	// (default engine.DefaultTimeout, 1s): the longest a decision waits.
	StoreTimeout time.Duration
	// DenialBytes bounds the proofs of denial the server keeps (0:
	// store.DefaultDenialBytes; negative: none). On a store that does not
	// decide in process, a decision the store's last answer proved denied
	// is denied without a store call, in every front door
	// (store.Denials; docs/semantics.md, "Local denials"). drip serve's
	// LOCAL_CACHE_SIZE_IN_BYTES sets it.
	DenialBytes int64
	// DenialStale is how long after the store's answer a proof of denial
	// is trusted at most (0: store.DefaultDenialStale): how late a refund
	// or a reset made on another instance may be seen.
	DenialStale time.Duration
	// MaxWait bounds the decision API's "wait": how long a take may wait
	// for its turn (default DefaultMaxWait, at most rules.MaxWait).
	MaxWait time.Duration
	// WatchEvery is how often the rules file is checked for changes
	// (default 1s; negative disables polling; SIGHUP and the admin API
	// still reload).
	WatchEvery time.Duration
	// Drain is how long the server drains once Serve's context ends
	// (SIGTERM or Ctrl-C in drip serve) before it shuts down (--drain,
	// DRIP_DRAIN; default DefaultDrain, 5s; negative: no drain). While it
	// drains every listener still serves, but each HTTP response carries
	// "Connection: close", so that clients on keep-alive connections
	// reconnect, and /readyz answers 503, envoyproxy/ratelimit's
	// /healthcheck 500 and the gRPC health service NOT_SERVING, so that
	// load balancers stop sending. Then the listeners stop accepting (gRPC
	// sends GOAWAY) and ShutdownTimeout bounds the rest. Server.EndDrain
	// ends it sooner.
	Drain time.Duration
	// ShutdownTimeout bounds a graceful shutdown, after the drain:
	// in-flight requests get this long to finish (default 10s).
	ShutdownTimeout time.Duration
	// Logger receives the server's logs (default slog.Default()).
	Logger *slog.Logger
	// TracerProvider, when set, traces the front listener's requests (a
	// server span each, a child of the W3C trace context they carry),
	// the engine's decisions and store calls, and Envoy's calls; the
	// gateway passes the trace context on to the upstream. Nil (the
	// default) turns tracing off, and the gateway then passes the
	// client's traceparent and tracestate through unchanged. cmd/drip
	// builds it from the OTEL_* environment variables.
	TracerProvider trace.TracerProvider
	// Collectors are more Prometheus collectors for /metrics, such as
	// leased tokens' (cmd/drip's --leased).
	Collectors []prometheus.Collector
}

// Defaults of Config.
const (
	DefaultListen          = "127.0.0.1:8080"
	DefaultAdminListen     = "127.0.0.1:9090"
	DefaultStoreTimeout    = engine.DefaultTimeout
	DefaultMaxWait         = 10 * time.Second
	DefaultReadTimeout     = 30 * time.Second
	DefaultWatchEvery      = time.Second
	DefaultShutdownTimeout = 10 * time.Second
	DefaultDrain           = 5 * time.Second
	DefaultMaxConnections  = 1024
)

// ClientCertsRequired says whether GRPCListen requires a certificate of
// every client (mutual TLS). Then decisions are made there only: a
// plaintext listener beside it would decide for any client that reaches
// it, certificate or not, against the same limits.
func (c Config) ClientCertsRequired() bool {
	if c.GRPCListen == "" || c.GRPCTLS == nil {
		return false
	}
	switch c.GRPCTLS.ClientAuth {
	case tls.RequireAnyClientCert, tls.RequireAndVerifyClientCert:
		return true
	}
	return false
}

func (c Config) withDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	if c.Store == "" {
		c.Store = "memory"
	}
	if c.StoreTimeout <= 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.MaxWait <= 0 {
		c.MaxWait = DefaultMaxWait
	}
	c.MaxWait = min(c.MaxWait, rules.MaxWait)
	if c.MaxConnections <= 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.WatchEvery == 0 {
		c.WatchEvery = DefaultWatchEvery
	}
	if c.Drain == 0 {
		c.Drain = DefaultDrain
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}
