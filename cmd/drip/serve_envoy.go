package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/driplimit/drip/server"
	"github.com/driplimit/drip/server/envoy"
	"github.com/driplimit/drip/server/envoy/xds"
	"github.com/driplimit/drip/store/redisstore"
)

// envoyproxy/ratelimit's environment, read by drip serve so that a
// deployment made for it (Envoy Gateway's, a Helm chart's) runs drip with
// only the image changed. docs/envoy.md has the table: each variable is
// honoured, honoured differently (and says how), or refused at start
// with an error that says why; none is silently ignored.

// explicit says whether a drip setting was given (its flag, or its DRIP_
// variable): given, it wins over envoyproxy/ratelimit's variables.
type explicit func(flag string) bool

// envoySettings are what envoyEnv finds besides server.Config: the Redis
// store's batching, the logger's level and format, and notes to log once
// the logger exists (variables accepted that change nothing).
type envoySettings struct {
	batching  *redisstore.Batching
	level     slog.Level
	json      bool
	notes     []string
	storeFrom string      // the variables the store URL came from, for errors
	tls       *tlsReloads // the TLS files watched: give it the logger, count its reloads
}

// envoyEnv applies envoyproxy/ratelimit's environment variables, from
// environ (os.Environ's form, KEY=value; the last of a key wins), to c;
// asRatelimit says drip was called as ratelimit (argsOf).
func envoyEnv(c *server.Config, environ []string, given explicit, asRatelimit bool) (*envoySettings, error) {
	st := &envoySettings{}
	vars := make(map[string]string, len(environ))
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	getenv := func(k string) string { return vars[k] }
	// Names that other programs and platforms set too (a Redis add-on's
	// REDIS_URL, a shared LOG_LEVEL) are read only in a deployment that
	// says it is made for envoyproxy/ratelimit; elsewhere the log says
	// they were not read.
	deployment := asRatelimit
	for _, v := range distinctVariables {
		deployment = deployment || getenv(v) != ""
	}
	if !deployment {
		full := getenv
		getenv = func(k string) string {
			if slices.Contains(commonVariables, k) {
				return ""
			}
			return full(k)
		}
		for _, v := range commonVariables {
			if full(v) != "" {
				st.notes = append(st.notes, fmt.Sprintf("%s is set, but no variable says this is a deployment made for envoyproxy/ratelimit (CONFIG_TYPE, RUNTIME_ROOT, REDIS_SOCKET_TYPE, GRPC_PORT, ...): not read, as other programs set it too (docs/envoy.md)", v))
			}
		}
	}
	// A misspelt variable would start drip without the setting it was
	// meant to make (GRPC_CLIENT_TLS_CA_CERT: TLS without client
	// certificates): refused.
	if err := unknownVariables(vars, deployment); err != nil {
		return nil, err
	}
	if deployment {
		st.notes = append(st.notes, inertNotes(vars)...)
	}
	e := &envoyReader{getenv: getenv, tls: newTLSReloads()}
	st.tls = e.tls
	opts, err := envoy.OptionsFromEnv(getenv)
	if err != nil {
		return nil, err
	}
	c.Envoy = opts

	// Where the configuration comes from. A deployment made for
	// envoyproxy/ratelimit (one that sets CONFIG_TYPE, or runs drip as
	// ratelimit) gets its listeners: gRPC on 0.0.0.0:8081, /healthcheck
	// on HOST:PORT. Elsewhere HOST and PORT are not read: platforms set
	// PORT for their own purposes (docs/envoy.md).
	mode := getenv("CONFIG_TYPE")
	ratelimitMode := mode != "" || asRatelimit
	switch mode {
	case "", "FILE":
		for _, v := range xdsVariables {
			if getenv(v) != "" {
				return nil, fmt.Errorf("%s is set but CONFIG_TYPE is %q: set CONFIG_TYPE=GRPC_XDS_SOTW to take the configuration from an xDS server", v, mode)
			}
		}
		if !given("rules") {
			c.Rules = envoy.RuntimeDir(getenv)
		}
	case "GRPC_XDS_SOTW":
		if given("rules") {
			return nil, errors.New("CONFIG_TYPE=GRPC_XDS_SOTW takes the Envoy configuration from an xDS server, and --rules (DRIP_RULES) names files: give one")
		}
		if c.XDS, err = xdsConfig(e); err != nil {
			return nil, err
		}
		c.XDSForceStart = e.bool("FORCE_START_WITHOUT_INITIAL_CONFIG")
	default:
		return nil, fmt.Errorf("CONFIG_TYPE=%q: want FILE or GRPC_XDS_SOTW", mode)
	}

	// The gRPC listener.
	if !given("grpc-listen") {
		if c.GRPCListen, err = envoy.GRPCListen(getenv); err != nil {
			return nil, err
		}
		if c.GRPCListen == "" && ratelimitMode {
			c.GRPCListen = "0.0.0.0:8081" // envoyproxy/ratelimit's default
		}
	}
	if getenv("GRPC_UDS") != "" {
		return nil, errors.New("GRPC_UDS: drip serves gRPC on TCP only (GRPC_HOST, GRPC_PORT or --grpc-listen)")
	}
	c.GRPCLimits.MaxConnectionAge = e.duration("GRPC_MAX_CONNECTION_AGE")
	c.GRPCLimits.MaxConnectionAgeGrace = e.duration("GRPC_MAX_CONNECTION_AGE_GRACE")
	if c.GRPCTLS, err = grpcServerTLS(e); err != nil {
		return nil, err
	}
	if c.GRPCTLS != nil && c.GRPCListen == "" {
		// TLS that guards no listener: drip would start without gRPC,
		// and the admin listener's POST /json would decide in plaintext.
		return nil, errors.New("GRPC_SERVER_USE_TLS=true, but there is no gRPC listener for it to guard: drip serve opens Envoy's rate limit service where GRPC_HOST, GRPC_PORT or --grpc-listen (DRIP_GRPC_LISTEN) say, on 0.0.0.0:8081 with CONFIG_TYPE or run as ratelimit; set one, or unset the TLS variables")
	}

	// The listeners of HOST:PORT and DEBUG_HOST:DEBUG_PORT.
	if ratelimitMode {
		port := e.port("PORT", "8080")
		c.HealthListen = net.JoinHostPort(or(getenv("HOST"), "0.0.0.0"), port)
		if !given("listen") {
			c.Listen = "off"
		} else if _, p, err := net.SplitHostPort(c.Listen); err == nil && p == port {
			return nil, fmt.Errorf("the decision API (--listen or DRIP_LISTEN, %s) and envoyproxy/ratelimit's /healthcheck (HOST and PORT, %s) share port %s: set PORT, or --listen off", c.Listen, c.HealthListen, port)
		}
	}
	debug := getenv("DEBUG_HOST") != "" || getenv("DEBUG_PORT") != ""
	if e.bool("USE_PROMETHEUS") {
		if debug {
			return nil, errors.New("USE_PROMETHEUS=true and DEBUG_HOST or DEBUG_PORT both name drip's admin listener (metrics, health, admin API): give one")
		}
		if p := getenv("PROMETHEUS_PATH"); p != "" && p != "/metrics" {
			return nil, fmt.Errorf("PROMETHEUS_PATH=%q: drip serves its metrics on /metrics", p)
		}
		if getenv("PROMETHEUS_MAPPER_YAML") != "" {
			return nil, errors.New("PROMETHEUS_MAPPER_YAML: drip's metrics are Prometheus metrics of their own (docs/envoy.md), with no statsd names to map")
		}
		if !given("admin-listen") {
			c.AdminListen = or(getenv("PROMETHEUS_ADDR"), ":9090")
		}
	} else if debug && !given("admin-listen") {
		c.AdminListen = net.JoinHostPort(or(getenv("DEBUG_HOST"), "0.0.0.0"), e.port("DEBUG_PORT", "6070"))
	}
	for _, v := range []string{"USE_STATSD", "USE_DOG_STATSD"} {
		if e.bool(v) {
			e.fail("%s=true: drip has no statsd client; its metrics are Prometheus metrics on the admin listener's /metrics (USE_PROMETHEUS=true puts it on PROMETHEUS_ADDR): set %s=false", v, v)
		}
	}
	if e.bool("TRACING_ENABLED") {
		e.fail("TRACING_ENABLED=true: drip reads OpenTelemetry's own OTEL_* variables (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, ...)")
	}

	// Logs.
	switch l := strings.ToLower(getenv("LOG_LEVEL")); l {
	case "trace", "debug":
		st.level = slog.LevelDebug
	case "", "info":
	case "warn", "warning":
		st.level = slog.LevelWarn
	case "error", "fatal", "panic":
		st.level = slog.LevelError
	default:
		e.fail("LOG_LEVEL=%q: want debug, info, warn or error", l)
	}
	switch f := strings.ToLower(getenv("LOG_FORMAT")); f {
	case "", "text":
	case "json":
		st.json = true
	default:
		e.fail("LOG_FORMAT=%q: want text or json", f)
	}

	// The store.
	if err := redisEnv(e, c, st, given); err != nil {
		return nil, err
	}

	// The local cache of keys over their limit: drip's proofs of denial
	// (store.Denials), exact, so on by default; 0 turns them off, as it
	// turns off envoyproxy/ratelimit's cache.
	if getenv("LOCAL_CACHE_SIZE_IN_BYTES") != "" {
		if n := e.int("LOCAL_CACHE_SIZE_IN_BYTES"); n == 0 {
			c.DenialBytes = -1
		} else {
			c.DenialBytes = int64(n)
		}
	}

	// Settings of envoyproxy/ratelimit's own cache that drip has no use
	// for: checked, then noted in the log.
	if v := getenv("NEAR_LIMIT_RATIO"); v != "" {
		if r, err := strconv.ParseFloat(v, 64); err != nil || r <= 0 || r > 1 {
			e.fail("NEAR_LIMIT_RATIO=%q: want a number above 0, at most 1", v)
		} else {
			st.notes = append(st.notes, "NEAR_LIMIT_RATIO: drip counts no near-limit statistic (its metrics count decisions by outcome); no effect")
		}
	}
	if e.int("EXPIRATION_JITTER_MAX_SECONDS") > 0 {
		st.notes = append(st.notes, "EXPIRATION_JITTER_MAX_SECONDS: drip's buckets expire once they would be full again, each at its own time; no effect")
	}
	if getenv("CACHE_KEY_PREFIX") != "" {
		e.fail("CACHE_KEY_PREFIX: drip keys Envoy's buckets by domain and descriptor under a prefix of its own; a prefix per deployment is a store of its own (another Redis database: REDIS_URL's /db)")
	}
	if b := strings.ToLower(getenv("BACKEND_TYPE")); b != "" && b != "redis" {
		e.fail("BACKEND_TYPE=%q: drip's stores are memory, Redis and PostgreSQL (--store); no memcache", b)
	}
	c.HealthNeedsConfig = e.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")
	return st, e.err()
}

// distinctVariables are envoyproxy/ratelimit's own names: one set says
// the deployment is made for it.
var distinctVariables = []string{
	"CONFIG_TYPE", "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "REDIS_SOCKET_TYPE", "REDIS_TYPE",
	"GRPC_HOST", "GRPC_PORT", "USE_STATSD", "LIMIT_RESPONSE_HEADERS_ENABLED", "FORCE_START_WITHOUT_INITIAL_CONFIG",
}

// commonVariables are names other programs set too, read only in a
// deployment made for envoyproxy/ratelimit.
var commonVariables = []string{
	"REDIS_URL", "LOG_LEVEL", "LOG_FORMAT", "DEBUG_HOST", "DEBUG_PORT", "USE_PROMETHEUS",
	"PROMETHEUS_ADDR", "PROMETHEUS_PATH", "PROMETHEUS_MAPPER_YAML", "TRACING_ENABLED",
}

// xdsVariables are read under CONFIG_TYPE=GRPC_XDS_SOTW only.
var xdsVariables = []string{
	"CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA",
	"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "FORCE_START_WITHOUT_INITIAL_CONFIG",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER",
}

// xdsConfig reads the xDS client's settings, with envoyproxy/ratelimit's
// defaults.
func xdsConfig(e *envoyReader) (*xds.Config, error) {
	c := &xds.Config{
		Server:       or(e.getenv("CONFIG_GRPC_XDS_SERVER_URL"), "localhost:18000"),
		NodeID:       or(e.getenv("CONFIG_GRPC_XDS_NODE_ID"), "default"),
		NodeMetadata: e.pairs("CONFIG_GRPC_XDS_NODE_METADATA"),
		Headers:      e.pairs("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"),
		Backoff:      xds.DefaultBackoff,
	}
	if d := e.duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"); d > 0 {
		c.Backoff.Initial = d // the older name of the first wait
	}
	if d := e.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"); d > 0 {
		c.Backoff.Initial = d
	}
	if d := e.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL"); d > 0 {
		c.Backoff.Max = d
	}
	if v := e.getenv("XDS_CLIENT_BACKOFF_RANDOM_FACTOR"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			return nil, fmt.Errorf("XDS_CLIENT_BACKOFF_RANDOM_FACTOR=%q: want a number from 0 to 1", v)
		}
		c.Backoff.RandomFactor = f
	}
	if e.getenv("XDS_CLIENT_BACKOFF_JITTER") != "" {
		c.Backoff.Jitter = e.bool("XDS_CLIENT_BACKOFF_JITTER")
	}
	if c.Backoff.Max < c.Backoff.Initial {
		return nil, fmt.Errorf("XDS_CLIENT_BACKOFF_MAX_INTERVAL %s is below the initial interval %s", c.Backoff.Max, c.Backoff.Initial)
	}
	if !e.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS") {
		for _, v := range []string{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN"} {
			if e.getenv(v) != "" {
				return nil, fmt.Errorf("%s is set but CONFIG_GRPC_XDS_SERVER_USE_TLS is not true: the xDS connection would be in plaintext", v)
			}
		}
		return c, e.err()
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: e.getenv("CONFIG_GRPC_XDS_SERVER_TLS_SAN")}
	if ca := e.getenv("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"); ca != "" {
		// Read again when it changes, as the client certificate is: each
		// connection to the xDS server gets the CAs in force.
		cas, err := caPool(e.tls, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca)
		if err != nil {
			return nil, fmt.Errorf("CONFIG_GRPC_XDS_SERVER_TLS_CACERT: %w", err)
		}
		cfg.RootCAs, _ = cas.get()
		c.RootCAs = cas.get
	}
	cert, key := e.getenv("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"), e.getenv("CONFIG_GRPC_XDS_CLIENT_TLS_KEY")
	if (cert == "") != (key == "") {
		return nil, errors.New("CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY: give both or neither")
	}
	if cert != "" {
		kp, err := keyPair(e.tls, "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert, key)
		if err != nil {
			return nil, fmt.Errorf("CONFIG_GRPC_XDS_CLIENT_TLS_CERT: %w", err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.get() }
	}
	c.TLS = cfg
	return c, e.err()
}

// grpcServerTLS reads GRPC_SERVER_USE_TLS and its files: the server's
// certificate, and the CA its clients' certificates must chain to (mutual
// TLS), under envoyproxy/ratelimit's name GRPC_CLIENT_TLS_CACERT or Envoy
// Gateway's GRPC_SERVER_TLS_CA_CERT; GRPC_CLIENT_TLS_SAN is a name the
// client's certificate must carry.
func grpcServerTLS(e *envoyReader) (*tls.Config, error) {
	files := []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT", "GRPC_CLIENT_TLS_SAN"}
	if !e.bool("GRPC_SERVER_USE_TLS") {
		for _, v := range files {
			if e.getenv(v) != "" {
				return nil, fmt.Errorf("%s is set but GRPC_SERVER_USE_TLS is not true: the gRPC listener would be in plaintext", v)
			}
		}
		return nil, e.err()
	}
	cert, key := e.getenv("GRPC_SERVER_TLS_CERT"), e.getenv("GRPC_SERVER_TLS_KEY")
	if cert == "" || key == "" {
		return nil, errors.New("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
	}
	kp, err := keyPair(e.tls, "GRPC_SERVER_TLS_CERT", cert, key)
	if err != nil {
		return nil, fmt.Errorf("GRPC_SERVER_TLS_CERT: %w", err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return kp.get() }}
	ca, eg := e.getenv("GRPC_CLIENT_TLS_CACERT"), e.getenv("GRPC_SERVER_TLS_CA_CERT")
	if ca != "" && eg != "" && ca != eg {
		return nil, fmt.Errorf("GRPC_CLIENT_TLS_CACERT=%q and GRPC_SERVER_TLS_CA_CERT=%q name two client CAs: give one", ca, eg)
	}
	caVar := "GRPC_CLIENT_TLS_CACERT"
	if ca == "" && eg != "" {
		ca, caVar = eg, "GRPC_SERVER_TLS_CA_CERT"
	}
	san := e.getenv("GRPC_CLIENT_TLS_SAN")
	if ca == "" {
		if san != "" {
			return nil, errors.New("GRPC_CLIENT_TLS_SAN needs a client CA (GRPC_CLIENT_TLS_CACERT): no client certificate is asked for without one")
		}
		return cfg, nil
	}
	cas, err := caPool(e.tls, caVar, ca)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", caVar, err)
	}
	pool, _ := cas.get()
	cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	if san != "" {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) > 0 && hasSAN(cs.PeerCertificates[0], san) {
				return nil
			}
			return fmt.Errorf("client certificate without the name %q (GRPC_CLIENT_TLS_SAN)", san)
		}
	}
	// The CA file is read again when it changes, as the certificate is:
	// each handshake gets cfg with the CAs in force.
	base := cfg.Clone()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := cas.get()
		if err != nil {
			return nil, err
		}
		c := base.Clone()
		c.ClientCAs = pool
		return c, nil
	}
	return cfg, nil
}

// hasSAN says whether cert carries name among its subject alternative
// names (DNS, URI, IP or email).
func hasSAN(cert *x509.Certificate, name string) bool {
	if slices.Contains(cert.DNSNames, name) || slices.Contains(cert.EmailAddresses, name) {
		return true
	}
	for _, u := range cert.URIs {
		if u.String() == name {
			return true
		}
	}
	for _, ip := range cert.IPAddresses {
		if ip.String() == name {
			return true
		}
	}
	return false
}

// redisEnv turns REDIS_* into the store URL and its batching.
func redisEnv(e *envoyReader, c *server.Config, st *envoySettings, given explicit) error {
	raw := e.getenv("REDIS_URL")
	if e.bool("REDIS_PERSECOND") {
		return errors.New("REDIS_PERSECOND=true: drip keeps every limit in one store (token buckets need no second Redis for per-second limits); unset it, and size REDIS_URL's server for all")
	}
	if raw == "" {
		if t := e.getenv("REDIS_SOCKET_TYPE"); t != "" && !given("store") {
			return fmt.Errorf("REDIS_SOCKET_TYPE=%s says the store is Redis, but REDIS_URL is not set: drip would keep its buckets in memory, each replica its own (N replicas would grant N times each limit); set REDIS_URL=host:port, or name the store with --store (DRIP_STORE)", t)
		}
		for _, v := range []string{"REDIS_TYPE", "REDIS_AUTH", "REDIS_TLS", "REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT"} {
			if e.getenv(v) != "" {
				return fmt.Errorf("%s is set without REDIS_URL", v)
			}
		}
		return nil
	}
	if given("store") {
		return errors.New("REDIS_URL and --store (DRIP_STORE) both name the store: give one")
	}
	if t := strings.ToLower(e.getenv("REDIS_SOCKET_TYPE")); t != "tcp" {
		if t == "" {
			t = "unset, which envoyproxy/ratelimit reads as unix"
		}
		return fmt.Errorf("REDIS_SOCKET_TYPE (%s): drip reaches Redis over TCP only: set REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port", t)
	}
	if e.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION") {
		return errors.New("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true: drip checks the name on Redis's certificate; give the name it carries with --store rediss://host:port?tls_server_name=NAME&tls_ca_file=... instead of REDIS_URL")
	}
	tlsOn := e.bool("REDIS_TLS")
	params := url.Values{}
	for v, p := range map[string]string{"REDIS_TLS_CACERT": "tls_ca_file", "REDIS_TLS_CLIENT_CERT": "tls_cert_file", "REDIS_TLS_CLIENT_KEY": "tls_key_file"} {
		if f := e.getenv(v); f != "" {
			if !tlsOn {
				return fmt.Errorf("%s is set but REDIS_TLS is not true", v)
			}
			params.Set(p, f)
		}
	}
	scheme := "redis"
	if tlsOn {
		scheme = "rediss"
	}
	var user *url.Userinfo
	if auth := e.getenv("REDIS_AUTH"); auth != "" {
		if u, p, ok := strings.Cut(auth, ":"); ok {
			user = url.UserPassword(u, p)
		} else {
			user = url.UserPassword("", auth)
		}
	}
	hosts := strings.Split(raw, ",")
	typ := strings.ToLower(e.getenv("REDIS_TYPE"))
	for i, h := range hosts {
		if typ == "sentinel" && i == 0 {
			continue // the master's name
		}
		if err := hostPort("REDIS_URL", i, len(hosts), h); err != nil {
			return err
		}
	}
	var u *url.URL
	switch t := typ; t {
	case "", "single":
		if len(hosts) > 1 {
			return errors.New("REDIS_URL: one host:port for REDIS_TYPE=single")
		}
		u = &url.URL{Scheme: scheme, User: user, Host: raw}
	case "cluster":
		u = &url.URL{Scheme: scheme, User: user, Host: hosts[0]}
		for _, h := range hosts[1:] {
			params.Add("addr", h)
		}
	case "sentinel":
		// envoyproxy/ratelimit's form: the master's name, then the
		// Sentinels.
		master, rest, ok := strings.Cut(raw, ",")
		if !ok || master == "" || strings.ContainsAny(master, ":@/") {
			return errors.New("REDIS_URL: for REDIS_TYPE=sentinel, the master's name then the Sentinels: name,host:port[,host:port...]")
		}
		u = &url.URL{Scheme: scheme + "+sentinel", User: user, Host: rest, Path: "/" + master}
	default:
		return fmt.Errorf("REDIS_TYPE=%q: want single, sentinel or cluster", t)
	}
	u.RawQuery = params.Encode()
	c.Store = u.String()
	st.storeFrom = "REDIS_URL"
	if n := e.int("REDIS_POOL_SIZE"); n > 0 {
		st.notes = append(st.notes, "REDIS_POOL_SIZE: drip's Redis client sends every call on one pipelined connection per server, coalescing concurrent decisions (REDIS_PIPELINE_*); no pool to size")
	}
	window, limit := e.duration("REDIS_PIPELINE_WINDOW"), e.int("REDIS_PIPELINE_LIMIT")
	if window > 0 || limit > 0 {
		b := redisstore.Batching{Window: window, MaxBatch: limit}
		st.batching = &b
	}
	return e.err()
}

// hostPort checks entry i of n of variable name, which must be
// host:port. Its error never quotes the entry: a URL there (a Redis
// add-on's REDIS_URL) may hold a password.
func hostPort(name string, i, n int, entry string) error {
	what := "it"
	if n > 1 {
		what = fmt.Sprintf("entry %d of %d", i+1, n)
	}
	switch host, port, err := net.SplitHostPort(entry); {
	case strings.Contains(entry, "://"):
		return fmt.Errorf("%s: %s is a URL, not host:port: drip reads %s as envoyproxy/ratelimit does; give the password in REDIS_AUTH, or the whole URL in --store (DRIP_STORE) instead", name, what, name)
	case strings.Contains(entry, "@"):
		return fmt.Errorf("%s: %s holds credentials (user:password@), not host:port: give the password in REDIS_AUTH", name, what)
	case err != nil || host == "" || strings.Contains(host, "/"):
		return fmt.Errorf("%s: %s is not host:port", name, what)
	default:
		if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
			return fmt.Errorf("%s: %s: the port is not a number from 1 to 65535", name, what)
		}
	}
	return nil
}

// envoyReader reads typed variables, keeping the first error.
type envoyReader struct {
	getenv func(string) string
	first  error
	tls    *tlsReloads // the TLS files it watches
}

func (e *envoyReader) fail(format string, args ...any) {
	if e.first == nil {
		e.first = fmt.Errorf(format, args...)
	}
}

func (e *envoyReader) err() error { return e.first }

func (e *envoyReader) bool(name string) bool {
	v := e.getenv(name)
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.fail("%s=%q: want true or false", name, v)
	}
	return b
}

// duration reads a Go duration (or a number of seconds), 0 when unset.
func (e *envoyReader) duration(name string) time.Duration {
	v := e.getenv(name)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.ParseFloat(v, 64)
		if nerr != nil || n > 1e9 {
			e.fail("%s=%q: want a duration (10s, 1m)", name, v)
			return 0
		}
		d = time.Duration(n * float64(time.Second))
	}
	if d < 0 {
		e.fail("%s=%q: negative", name, v)
		return 0
	}
	return d
}

func (e *envoyReader) int(name string) int {
	v := e.getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		e.fail("%s=%q: want a whole number, 0 or more", name, v)
	}
	return n
}

func (e *envoyReader) port(name, def string) string {
	v := or(e.getenv(name), def)
	if n, err := strconv.Atoi(v); err != nil || n < 0 || n > 65535 {
		e.fail("%s=%q: want a port number", name, v)
	}
	return v
}

// pairs reads "k1:v1,k2:v2" (or k=v).
func (e *envoyReader) pairs(name string) map[string]string {
	v := e.getenv(name)
	if v == "" {
		return nil
	}
	m := map[string]string{}
	entries := strings.Split(v, ",")
	for n, p := range entries {
		i := strings.IndexAny(p, ":=")
		if i <= 0 {
			// Not quoted: a header's value may be a credential.
			e.fail("%s: entry %d of %d is not key:value", name, n+1, len(entries))
			return nil
		}
		m[strings.TrimSpace(p[:i])] = strings.TrimSpace(p[i+1:])
	}
	return m
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
