package main

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/driplimit/drip/internal/nearest"
)

// The names of envoyproxy/ratelimit's environment, as its settings
// declare them, and Envoy Gateway's one more. In a deployment made for
// envoyproxy/ratelimit, a variable with one of their prefixes that is
// not among them is a typo until proven otherwise, and refused: drip
// would otherwise start without the setting it was meant to make.

// readVariables are the names drip reads (serve_envoy.go,
// envoy.OptionsFromEnv): each honoured, honoured differently, or refused
// for a value drip cannot keep.
var readVariables = []string{
	"CONFIG_TYPE", "FORCE_START_WITHOUT_INITIAL_CONFIG", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
	"CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA",
	"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER",
	"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT",
	"MERGE_DOMAIN_CONFIG", "SHADOW_MODE", "QUOTA_MODE", "RESPONSE_DYNAMIC_METADATA",
	"LIMIT_RESPONSE_HEADERS_ENABLED", "LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER",
	"GRPC_HOST", "GRPC_PORT", "GRPC_UDS", "GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE",
	"GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT",
	"GRPC_SERVER_TLS_CA_CERT", "GRPC_CLIENT_TLS_SAN",
	"HOST", "PORT", "DEBUG_HOST", "DEBUG_PORT",
	"USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_PATH", "PROMETHEUS_MAPPER_YAML",
	"USE_STATSD", "USE_DOG_STATSD", "TRACING_ENABLED", "LOG_LEVEL", "LOG_FORMAT",
	"REDIS_URL", "REDIS_TYPE", "REDIS_SOCKET_TYPE", "REDIS_AUTH", "REDIS_TLS", "REDIS_TLS_CACERT",
	"REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
	"REDIS_POOL_SIZE", "REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT", "REDIS_PERSECOND",
	"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "BACKEND_TYPE", "CACHE_KEY_PREFIX",
	"LOCAL_CACHE_SIZE_IN_BYTES", "NEAR_LIMIT_RATIO", "EXPIRATION_JITTER_MAX_SECONDS",
	"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
}

// inertVariables are envoyproxy/ratelimit's names that tune a part of it
// drip does not have, which the variable that turns that part on refuses:
// accepted, and each set one noted in the log. Keyed by name, then by
// prefix (a key ending in _).
var inertVariables = map[string]string{
	"STATSD_HOST":               "envoyproxy/ratelimit's statsd client (USE_STATSD=true is refused)",
	"STATSD_PORT":               "envoyproxy/ratelimit's statsd client (USE_STATSD=true is refused)",
	"EXTRA_TAGS":                "envoyproxy/ratelimit's statsd client (USE_STATSD=true is refused)",
	"STATS_FLUSH_INTERVAL":      "envoyproxy/ratelimit's statsd client (USE_STATSD=true is refused)",
	"DISABLE_STATS":             "envoyproxy/ratelimit's statsd client (USE_STATSD=true is refused)",
	"USE_DOG_STATSD_MOGRIFIERS": "envoyproxy/ratelimit's DogStatsD client (USE_DOG_STATSD=true is refused)",
	"MEMCACHE_":                 "envoyproxy/ratelimit's memcache backend (BACKEND_TYPE=memcache is refused)",
	"REDIS_PERSECOND_":          "envoyproxy/ratelimit's second Redis (REDIS_PERSECOND=true is refused)",
	"TRACING_":                  "envoyproxy/ratelimit's tracer (TRACING_ENABLED=true is refused; drip reads OTEL_*)",
	"PROTO":                     "the protocol of envoyproxy/ratelimit's debug listener (drip's admin listener is HTTP over TCP)",
}

// inertNames are inertVariables' names in full, for the nearest name.
var inertNames = []string{
	"STATSD_HOST", "STATSD_PORT", "EXTRA_TAGS", "STATS_FLUSH_INTERVAL", "DISABLE_STATS", "USE_DOG_STATSD_MOGRIFIERS", "PROTO",
	"MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS",
	"MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
	"REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL", "REDIS_PERSECOND_POOL_SIZE",
	"REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_LIMIT",
	"TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID", "TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE",
}

// guardedPrefixes are the prefixes of envoyproxy/ratelimit's names that
// no other program in such a deployment is expected to use; outside one,
// only the first six, those of the variables drip reads there.
var guardedPrefixes = []string{
	"GRPC_", "CONFIG_GRPC_", "XDS_CLIENT_", "REDIS_", "RUNTIME_", "LIMIT_", "MEMCACHE_", "PROMETHEUS_", "TRACING_", "STATSD_",
}

// otherPrograms are names under guardedPrefixes that others read: gRPC's
// own (grpc-go in drip reads them), and the variables Kubernetes sets
// for each Service of the namespace (a Service named redis gives
// REDIS_SERVICE_HOST, REDIS_PORT=tcp://..., REDIS_PORT_6379_TCP ...).
var (
	grpcOwn      = regexp.MustCompile(`^GRPC_(GO_|XDS_|EXPERIMENTAL_|TRACE$|VERBOSITY$|ENFORCE_ALPN_ENABLED$|DEFAULT_SSL_ROOTS_FILE_PATH$)`)
	serviceLink  = regexp.MustCompile(`^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)$`)
	serviceLinkP = regexp.MustCompile(`^[A-Z0-9_]+_PORT$`)
	linkValue    = regexp.MustCompile(`^(tcp|udp|sctp)://`)
)

// platformVariables are names under guardedPrefixes that platforms set
// for applications of their own (Heroku's Redis: REDIS_TLS_URL beside
// REDIS_URL): not checked outside a deployment made for
// envoyproxy/ratelimit, where drip does not read REDIS_URL either.
var platformVariables = []string{"REDIS_TLS_URL"}

// unknownVariables refuses the first name in vars, in sort order, that
// has a guarded prefix but is neither read by drip, inert, nor another
// program's; its error names the nearest known name. deployment says
// the environment is made for envoyproxy/ratelimit (envoyEnv).
func unknownVariables(vars map[string]string, deployment bool) error {
	names := make([]string, 0, len(vars))
	for k := range vars {
		names = append(names, k)
	}
	sort.Strings(names)
	guarded := guardedPrefixes
	if !deployment {
		guarded = guarded[:6]
	}
	for _, k := range names {
		if vars[k] == "" || !slices.ContainsFunc(guarded, func(p string) bool { return strings.HasPrefix(k, p) }) ||
			slices.Contains(readVariables, k) || inert(k) != "" || grpcOwn.MatchString(k) ||
			serviceLink.MatchString(k) || serviceLinkP.MatchString(k) && linkValue.MatchString(vars[k]) ||
			!deployment && slices.Contains(platformVariables, k) {
			continue
		}
		near, _ := nearest.Name(k, append(slices.Clone(readVariables), inertNames...))
		return fmt.Errorf("%s is set, but neither envoyproxy/ratelimit nor drip has such a variable: did you mean %s? A misspelt setting would start drip without it; unset %s or correct its name (docs/envoy.md, \"The environment\")", k, near, k)
	}
	return nil
}

// inert says what part of envoyproxy/ratelimit the inert variable k
// tunes, or "".
func inert(k string) string {
	if why, ok := inertVariables[k]; ok {
		return why
	}
	for p, why := range inertVariables {
		if strings.HasSuffix(p, "_") && strings.HasPrefix(k, p) && slices.Contains(inertNames, k) {
			return why
		}
	}
	return ""
}

// inertNotes are the log's notes on the inert variables set in vars.
func inertNotes(vars map[string]string) []string {
	var notes []string
	for _, k := range inertNames {
		if vars[k] != "" {
			notes = append(notes, fmt.Sprintf("%s tunes %s; no effect", k, inert(k)))
		}
	}
	return notes
}
