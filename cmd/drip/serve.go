package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/driplimit/drip/internal/redact"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/server"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/redisstore"
)

func init() {
	register(command{name: "serve", brief: "run the decision API or gateway, with metrics and an admin API", run: runServe})
}

func runServe(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("serve")
	var c server.Config
	fs.StringVar(&c.Listen, "listen", envOr("DRIP_LISTEN", server.DefaultListen), `address of the decision API, or of the gateway with --upstream; "off" disables it (env DRIP_LISTEN)`)
	fs.StringVar(&c.AdminListen, "admin-listen", envOr("DRIP_ADMIN_LISTEN", server.DefaultAdminListen), `address of /metrics, /healthz, /readyz, the admin API and Envoy's /healthcheck and /json; "off" disables it (env DRIP_ADMIN_LISTEN)`)
	fs.StringVar(&c.AdminToken, "admin-token", envOr("DRIP_ADMIN_TOKEN", ""), "bearer token of the admin API; without one the admin API is off (env DRIP_ADMIN_TOKEN)")
	tokenFile := fs.String("admin-token-file", envOr("DRIP_ADMIN_TOKEN_FILE", ""), "file holding the admin API's bearer token, kept out of ps (env DRIP_ADMIN_TOKEN_FILE)")
	fs.StringVar(&c.Rules, "rules", envOr("DRIP_RULES", ""), "rules file, JSON or YAML, or envoyproxy/ratelimit config files (a file or a directory) (default: the built-in rules) (env DRIP_RULES)")
	fs.StringVar(&c.Store, "store", envOr("DRIP_STORE", "memory"), "store: memory, postgres://..., redis://..., rediss://..., redis+sentinel://... (env DRIP_STORE)")
	storeFile := fs.String("store-file", envOr("DRIP_STORE_FILE", ""), "file holding the store URL, which may hold a password, kept out of ps and the environment (a mounted Secret, say); not with --store (env DRIP_STORE_FILE)")
	fs.StringVar(&c.Upstream, "upstream", envOr("DRIP_UPSTREAM", ""), "upstream URL: serve as a gateway that applies the rules to every request (env DRIP_UPSTREAM)")
	fs.StringVar(&c.GRPCListen, "grpc-listen", envOr("DRIP_GRPC_LISTEN", ""), "address of Envoy's rate limit gRPC service (env DRIP_GRPC_LISTEN; else envoyproxy/ratelimit's GRPC_HOST and GRPC_PORT when either is set)")
	fs.BoolVar(&c.GRPCReflection, "grpc-reflection", envOr("DRIP_GRPC_REFLECTION", "") == "true", "serve gRPC server reflection on --grpc-listen (env DRIP_GRPC_REFLECTION=true)")
	timeoutDefault, ok := envDuration("DRIP_STORE_TIMEOUT", server.DefaultStoreTimeout, false, stderr)
	if !ok {
		return 2
	}
	storeTimeout := fs.Duration("store-timeout", timeoutDefault, "deadline of each store call (env DRIP_STORE_TIMEOUT)")
	maxWaitDefault, ok := envDuration("DRIP_MAX_WAIT", server.DefaultMaxWait, false, stderr)
	if !ok {
		return 2
	}
	maxWait := fs.Duration("max-wait", maxWaitDefault, "the longest a decision API take may wait for its turn (\"wait\"), at most 1m (env DRIP_MAX_WAIT)")
	leasedOn := fs.Bool("leased", envOr("DRIP_LEASED", "") == "true", "leased tokens for every limit: decide all token buckets and fixed windows from blocks of their tokens taken from the store, never over the limit (docs/semantics.md, \"Leased tokens\"); without it only the rules and Envoy limits marked leased are; on the memory store, in the process, nothing is leased (env DRIP_LEASED=true)")
	drainDefault, ok := envDuration("DRIP_DRAIN", server.DefaultDrain, true, stderr)
	if !ok {
		return 2
	}
	drain := fs.Duration("drain", drainDefault, "on SIGTERM or SIGINT, serve this long with every answer closing its connection and /readyz at 503, then shut down (a second signal ends it); 0: shut down at once (env DRIP_DRAIN)")
	if code, done := parseFlags(fs, serveUsage, args, stdout, stderr); done {
		return code
	}
	if *maxWait <= 0 || *maxWait > rules.MaxWait {
		fmt.Fprintf(stderr, "drip serve: --max-wait %s is not from 1ns to %s\n", *maxWait, rules.MaxWait)
		return 2
	}
	if *drain < 0 {
		fmt.Fprintf(stderr, "drip serve: --drain %s is negative\n", *drain)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "drip serve: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := misspeltDRIP(fs, os.Environ()); err != nil {
		fmt.Fprintln(stderr, "drip serve:", err)
		return 2
	}
	if err := fromFile(&c.AdminToken, *tokenFile, c.AdminToken != "", "admin-token"); err != nil {
		fmt.Fprintln(stderr, "drip serve:", err)
		return 2
	}
	c.StoreTimeout = *storeTimeout
	c.MaxWait = *maxWait
	c.Drain = *drain
	if c.Drain == 0 {
		c.Drain = -1 // server.Config's "no drain"
	}
	given := func(name string) bool { // set by its flag or its DRIP_ variable
		set := os.Getenv("DRIP_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))) != ""
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
		return set
	}
	if err := fromFile(&c.Store, *storeFile, given("store"), "store"); err != nil {
		fmt.Fprintln(stderr, "drip serve:", err)
		return 2
	}
	givenStore := given
	given = func(name string) bool { return givenStore(name) || name == "store" && *storeFile != "" }
	env, err := envoyEnv(&c, os.Environ(), given, asRatelimit) // envoyproxy/ratelimit's variables (serve_envoy.go)
	if err != nil {
		fmt.Fprintln(stderr, "drip serve:", err)
		return 2
	}
	hopts := &slog.HandlerOptions{Level: env.level}
	c.Logger = slog.New(slog.NewTextHandler(stderr, hopts))
	if env.json {
		c.Logger = slog.New(slog.NewJSONHandler(stderr, hopts))
	}
	for _, n := range env.notes {
		c.Logger.Info("drip serve: envoyproxy/ratelimit setting accepted: " + n)
	}
	if len(env.tls.names) > 0 { // TLS files watched: their reloads are logged and counted
		env.tls.log = c.Logger
		c.Collectors = append(c.Collectors, env.tls.count)
	}
	tp, err := startTracing(ctx, os.Getenv, c.Logger) // tracing.go
	if err != nil {
		fmt.Fprintln(stderr, "drip serve:", err)
		return 2
	}
	if tp != nil {
		c.TracerProvider = tp
		defer func() {
			// Flush the spans still batched, within the shutdown's
			// bound: the collector may be down.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), server.DefaultShutdownTimeout)
			defer cancel()
			if err := tp.Shutdown(sctx); err != nil {
				c.Logger.Warn("drip serve: tracing shutdown", "err", err)
			}
		}()
	}

	var redisOpts []redisstore.Option
	if env.batching != nil { // REDIS_PIPELINE_WINDOW, REDIS_PIPELINE_LIMIT
		redisOpts = append(redisOpts, redisstore.WithBatching(*env.batching))
	}
	store, closeStore, err := openServeStore(ctx, c.Store, c.Logger, redisOpts...) // connect.go: a store down is no reason not to start
	if err != nil {
		fmt.Fprintln(stderr, "drip serve:", err)
		return 1
	}
	defer closeStore()
	var byRule *leasedRules
	caps := store.Caps()
	if !caps.InProcess && (*leasedOn || caps.Blocks) {
		// Leased tokens: every token bucket and fixed window with
		// --leased, else the limits marked leased (a rule's "leased":
		// true, an Envoy rate_limit's leased: true), which a reload may
		// add; every other call passes through. The memory store is in
		// the process already: there leasing saves no call and costs the
		// blocks' bookkeeping on every take, so every limit is decided as
		// without it, exactly, --leased or not (the banner says so).
		byRule = newLeasedRules()
		opts := []leased.Option{leased.WithObserver(byRule)}
		if !*leasedOn {
			opts = append(opts, leased.Marked())
		}
		ls, err := leased.New(store, opts...)
		if err != nil {
			fmt.Fprintln(stderr, "drip serve: --leased:", err)
			return 1
		}
		defer ls.Close() // before closeStore: it gives the blocks back
		store = ls
		c.Collectors = append(c.Collectors, leasedCollector{ls}, byRule)
	}
	s, err := server.New(c, store)
	if err != nil {
		fmt.Fprintln(stderr, "drip serve:", err)
		return 1
	}
	if byRule != nil {
		ruleOf := s.RuleOf
		byRule.ruleOf.Store(&ruleOf)
	}
	if err := s.Listen(); err != nil {
		fmt.Fprintln(stderr, "drip serve:", err)
		return 1
	}

	// SIGHUP reloads the rules; registered before the banner, so that a
	// SIGHUP sent once drip says it listens never kills it.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	hupDone := make(chan struct{})
	defer close(hupDone)
	go func() {
		for {
			select {
			case <-hup:
				_ = s.Reload() // logged and counted by Reload
			case <-hupDone:
				return
			}
		}
	}()

	// The first SIGTERM or SIGINT ends ctx (main), and the drain begins;
	// a second ends the drain.
	stop := make(chan os.Signal, 2)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stop)
	go func() {
		for n := 0; ; {
			select {
			case <-stop:
				if n++; n == 2 {
					s.EndDrain()
				}
			case <-hupDone:
				return
			}
		}
	}()

	storeName := redact.URL(c.Store) // never print a password
	switch {
	case *leasedOn && caps.InProcess:
		storeName += ", nothing leased: the store is in the process"
	case *leasedOn:
		storeName += ", every limit leased"
	}
	rules := c.Rules
	switch {
	case c.XDS != nil:
		rules = "Envoy's from the xDS server"
	case rules == "":
		rules = "built-in defaults"
	}
	switch {
	case s.Addr() == nil:
		fmt.Fprintf(stdout, "drip serve: no decision API (--listen off; store %s, rules %s)\n", storeName, rules)
	case c.Upstream != "":
		fmt.Fprintf(stdout, "drip serve: gateway on http://%s -> %s (store %s, rules %s)\n", s.Addr(), redact.URL(c.Upstream), storeName, rules)
	default:
		fmt.Fprintf(stdout, "drip serve: decision API on http://%s (POST /v1/take, /v1/peek, /v1/refund, /v1/reset, /v1/acquire, /v1/release; GET /v1/forward-auth; store %s, rules %s)\n", s.Addr(), storeName, rules)
	}
	if a := s.AdminAddr(); a != nil {
		admin := "off (no --admin-token)"
		if c.AdminToken != "" {
			admin = "on /v1/admin/"
		}
		fmt.Fprintf(stdout, "drip serve: metrics on http://%s/metrics, health on /healthz and /readyz, admin API %s\n", a, admin)
	}
	if a := s.GRPCAddr(); a != nil {
		how := ""
		switch {
		case c.ClientCertsRequired():
			how = " over TLS, client certificates required (mutual TLS; no other listener decides)"
		case c.GRPCTLS != nil:
			how = " over TLS, no client certificate asked for"
		}
		fmt.Fprintf(stdout, "drip serve: Envoy rate limit service (envoy.service.ratelimit.v3, gRPC) on %s%s\n", a, how)
	}
	if a := s.HealthAddr(); a != nil {
		fmt.Fprintf(stdout, "drip serve: envoyproxy/ratelimit's /healthcheck on http://%s (PORT)\n", a)
	}
	if c.XDS != nil {
		fmt.Fprintf(stdout, "drip serve: Envoy configuration from the xDS server %s (node %s)\n", c.XDS.Server, c.XDS.NodeID)
	}
	if err := s.Serve(ctx); err != nil {
		fmt.Fprintln(stderr, "drip serve:", err)
		return 1
	}
	return 0
}

// envDuration reads the duration in environment variable name, def when
// it is unset. A value that is not a duration, negative, or zero unless
// zeroOK, is reported to stderr, and ok is false.
func envDuration(name string, def time.Duration, zeroOK bool, stderr io.Writer) (d time.Duration, ok bool) {
	v := envOr(name, "")
	if v == "" {
		return def, true
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d == 0 && !zeroOK {
		what := "a positive duration"
		if zeroOK {
			what = "a duration of 0 or more"
		}
		fmt.Fprintf(stderr, "drip serve: %s=%q is not %s\n", name, v, what)
		return 0, false
	}
	return d, true
}

// fromFile sets *dst to the secret in file (readToken) when file is
// not "", refusing a value set beside it: flag names the value's flag,
// whose file is --flag-file.
func fromFile(dst *string, file string, set bool, flag string) error {
	if file == "" {
		return nil
	}
	if set {
		return fmt.Errorf("--%s and --%s-file (or their DRIP_ variables) both set: give one", flag, flag)
	}
	v, err := readToken(file)
	if err != nil {
		return fmt.Errorf("--%s-file: %w", flag, err)
	}
	*dst = v
	return nil
}

// readToken reads a file holding a secret (a token, a store URL): its
// content less surrounding white space (a trailing newline, say); an
// empty file or one over 4 KiB is an error. The error never quotes the
// content.
func readToken(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4<<10+1))
	if err != nil {
		return "", err
	}
	if len(b) > 4<<10 {
		return "", fmt.Errorf("%s: over 4 KiB", path)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%s: empty", path)
	}
	return tok, nil
}
