package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// Every subcommand explains itself the same way: "drip CMD -h" (or
// --help) prints its usage text and its flags on stdout and exits 0; a
// bad flag is one line on stderr, with a pointer to -h, and exit 2.

// newFlagSet returns a flag set for "drip name" that prints nothing by
// itself: parseFlags says what went wrong.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseFlags parses args into fs. On -h it prints usage and the flags on
// stdout; on a bad flag, one line on stderr. done reports that the
// command should return code now.
func parseFlags(fs *flag.FlagSet, usage string, args []string, stdout, stderr io.Writer) (code int, done bool) {
	err := fs.Parse(args)
	if err == nil {
		return 0, false
	}
	if errors.Is(err, flag.ErrHelp) {
		printUsage(fs, usage, stdout)
		return 0, true
	}
	fmt.Fprintf(stderr, "drip %s: %v\nRun 'drip %s -h' for usage.\n", fs.Name(), err, fs.Name())
	return 2, true
}

// printUsage writes usage and fs's flags to w.
func printUsage(fs *flag.FlagSet, usage string, w io.Writer) {
	fmt.Fprint(w, usage)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

const serveUsage = `usage: drip serve [flags]

Runs the decision API (or, with --upstream, a gateway that applies the rules
to every request it proxies), with Prometheus metrics, health checks and an
admin API on a second listener. With no flags at all it runs on the embedded
memory store with the built-in rules (every client IP 10 requests/s with
bursts of 20, and a shadow rule that counts all traffic past 1000/s). SIGHUP, a changed rules file or POST /v1/admin/reload reloads
the rules; SIGTERM or SIGINT shuts down gracefully, after a drain (--drain)
in which every listener still serves but each answer closes its connection
and /readyz answers 503; a second SIGTERM or SIGINT ends the drain.

Decision API (no --upstream): POST /v1/take, /v1/peek, /v1/refund, /v1/reset,
and /v1/acquire and /v1/release for in-flight (concurrency) limits, with a
JSON request (an inline key and limit, or a rule and its key values),
answered with a JSON decision; docs/api.md describes both. Beside it,
GET /v1/forward-auth decides, as the gateway would, the request that a proxy
in front (nginx auth_request, Caddy, Traefik ForwardAuth) describes in its
X-Forwarded-* or X-Original-* headers; examples/nginx, examples/caddy and
examples/traefik hold working configs, and the proxy's address must be in
the rules' trusted_proxies.

Every flag has an environment variable (shown with each flag); a flag given
on the command line wins.

Envoy's rate limit service (--grpc-listen, and /json and /healthcheck on the
admin listener) reads envoyproxy/ratelimit's config files at --rules, and
its environment: MERGE_DOMAIN_CONFIG, SHADOW_MODE, QUOTA_MODE,
RUNTIME_IGNOREDOTFILES and RESPONSE_DYNAMIC_METADATA (true or false);
LIMIT_RESPONSE_HEADERS_ENABLED (true: envoyproxy/ratelimit's three headers,
named by LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER;
false: none; unset: drip's RateLimit headers); RUNTIME_ROOT,
RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY for the config directory when
--rules is not given; GRPC_HOST and GRPC_PORT for the gRPC listener when
--grpc-listen is not given. DRIP_ENVOY_ALGORITHM=fixed_window counts its
limits in envoyproxy/ratelimit's windows instead of refilling them
continuously; DRIP_ENVOY_LEASED=true leases every limit without its own
"leased" (decided from blocks of its tokens: memory, Redis and PostgreSQL
stores hold them).
docs/envoy.md has the details. The rest of
envoyproxy/ratelimit's environment (CONFIG_TYPE=GRPC_XDS_SOTW and the xDS
client, REDIS_*, GRPC_SERVER_USE_TLS, HOST and PORT, LOG_*, ...) is read
too, each variable honoured or refused at start: docs/envoy.md. Called as
ratelimit (Envoy Gateway's /bin/ratelimit), drip is drip serve --listen off.

Tracing (OpenTelemetry, OTLP) is off unless OTEL_TRACES_EXPORTER=otlp or
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set;
OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none keeps it off.
OTEL_EXPORTER_OTLP_PROTOCOL (or _TRACES_PROTOCOL) is http/protobuf (default)
or grpc. The exporter reads the other OTEL_EXPORTER_OTLP_* variables
(headers, timeout, TLS), the SDK OTEL_SERVICE_NAME (default drip),
OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG and
OTEL_BSP_*. Trace context is W3C traceparent and tracestate, passed on to
the upstream. docs/operations.md (Tracing) lists the spans.

Examples:
  drip serve
  drip serve --rules examples/rules.json
  drip serve --store postgres://drip@db/app --rules rules.yaml --admin-token "$TOKEN"
  drip serve --upstream http://127.0.0.1:3000 --listen :8080 --rules rules.yaml
  drip serve --grpc-listen :8081 --rules /etc/ratelimit/config/
`

const replayUsage = `usage: drip replay [--store URL] [--prefix P] < requests.jsonl

Reads requests as JSON lines on stdin (one take, peek, refund, reset or
multi-take per line, each at a virtual time "at" in seconds) and writes one
decision per line on stdout, in order. Time is virtual: nothing sleeps, and
virtual time 0 is the wall clock at the start of the run. A line that is not
valid prints {"error": "..."} and replay goes on. docs/api.md describes the
request and decision shapes.

Examples:
  echo '{"at": 0, "key": "u", "cost": 5, "limit": {"rate": 5, "period": "10s", "burst": 20}}' | drip replay
  drip replay --store redis://localhost:6379 < trace.jsonl
`

const checkUsage = `usage: drip check PATH...

Validates each rules file as drip serve --rules would load it, and prints
every problem, one per line ("file:line: path: message"). PATH is a drip
rules file (JSON or YAML; docs/rules.md), or envoyproxy/ratelimit config
files: a file with a top-level "domain" or "descriptors", or a directory
of them (its *.yaml, *.yml and *.json files are loaded together, as drip
serve --rules DIR does). envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG and
RUNTIME_IGNOREDOTFILES, and DRIP_ENVOY_ALGORITHM and DRIP_ENVOY_LEASED,
apply as in drip serve.

Exit status: 0 when every file is good, 1 when one is bad, 2 on a usage
error.

Examples:
  drip check examples/rules.json
  drip check rules.yaml /etc/ratelimit/config/
`

const pgUsage = `usage: drip pg install --url postgres://... [--unlogged | --logged]

install creates drip's schema in a PostgreSQL database: the tables
drip.buckets (token buckets, fixed and sliding windows), drip.leases and
drip.lease_holders (the leases of in-flight limits) and drip.overrides
(drip serve's per-tenant limits), and
the SQL functions drip.take, drip.peek, drip.refund and drip.reset (so that
any language can share the buckets), or migrates the schema of an older
drip. Running it again is harmless. --unlogged and --logged apply to
drip.buckets and the lease tables; the overrides are always logged. drip serve
and drip replay can also install it themselves when their store URL says
?drip_install=true.

Examples:
  drip pg install --url postgres://postgres@localhost/app
  drip pg install --url postgres://postgres@localhost/app --unlogged
`

const versionUsage = `usage: drip version

Prints drip's module version (v1.2.3 for a released build; built from a
clone, the pseudo-version Go makes of the commit, v0.0.0-<date>-<commit>;
"(devel)" when the build recorded no version control information, as with
go run or -buildvcs=false) and, when the build recorded it, the VCS
revision and whether the tree was modified.
`
