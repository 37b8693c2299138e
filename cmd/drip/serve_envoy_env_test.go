package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/server/envoy/xds"
	"github.com/driplimit/drip/store/redisstore"

	"github.com/driplimit/drip/server"
	"github.com/driplimit/drip/server/envoy"
)

// TestEnvoyEnv: envoyproxy/ratelimit's variables reach drip serve's
// configuration, and --rules wins over RUNTIME_ROOT.
func TestEnvoyEnv(t *testing.T) {
	t.Setenv("RUNTIME_ROOT", "/data")
	t.Setenv("RUNTIME_SUBDIRECTORY", "ratelimit")
	t.Setenv("MERGE_DOMAIN_CONFIG", "true")
	t.Setenv("SHADOW_MODE", "false")
	t.Setenv("RUNTIME_IGNOREDOTFILES", "true")
	var c server.Config
	if _, err := envoyEnv(&c, os.Environ(), none, false); err != nil {
		t.Fatal(err)
	}
	if c.Rules != "/data/ratelimit/config" || c.Envoy != (envoy.Options{MergeDomains: true, IgnoreDotfiles: true}) {
		t.Fatalf("%q %+v", c.Rules, c.Envoy)
	}
	if c.GRPCListen != "" {
		t.Fatalf("gRPC listener %q without GRPC_HOST or GRPC_PORT", c.GRPCListen)
	}
	c = server.Config{Rules: "mine.yaml"}
	if _, err := envoyEnv(&c, os.Environ(), func(f string) bool { return f == "rules" }, false); err != nil || c.Rules != "mine.yaml" {
		t.Fatalf("%q %v", c.Rules, err)
	}
	t.Setenv("GRPC_PORT", "9081")
	c = server.Config{}
	if _, err := envoyEnv(&c, os.Environ(), none, false); err != nil || c.GRPCListen != "0.0.0.0:9081" {
		t.Fatalf("GRPC_PORT=9081: %q %v", c.GRPCListen, err)
	}
	c = server.Config{GRPCListen: "127.0.0.1:7000"} // --grpc-listen wins
	if _, err := envoyEnv(&c, os.Environ(), func(f string) bool { return f == "grpc-listen" }, false); err != nil || c.GRPCListen != "127.0.0.1:7000" {
		t.Fatalf("--grpc-listen: %q %v", c.GRPCListen, err)
	}
	t.Setenv("GRPC_HOST", "::1")
	t.Setenv("GRPC_PORT", "")
	c = server.Config{}
	if _, err := envoyEnv(&c, os.Environ(), none, false); err != nil || c.GRPCListen != "[::1]:8081" {
		t.Fatalf("GRPC_HOST=::1: %q %v", c.GRPCListen, err)
	}
	t.Setenv("GRPC_PORT", "http")
	if _, err := envoyEnv(&server.Config{}, os.Environ(), none, false); err == nil {
		t.Fatal("GRPC_PORT=http accepted")
	}
	t.Setenv("GRPC_PORT", "")
	t.Setenv("GRPC_HOST", "")
	t.Setenv("SHADOW_MODE", "sometimes")
	if _, err := envoyEnv(&c, os.Environ(), none, false); err == nil {
		t.Fatal("SHADOW_MODE=sometimes accepted")
	}
}

// none: no drip setting given.
func none(string) bool { return false }

// TestRatelimitEnv: each of envoyproxy/ratelimit's variables is honoured
// (the setting it makes) or refused with an error naming it.
func TestRatelimitEnv(t *testing.T) {
	ca := testserver.NewCA(t, "env")
	cert, key := ca.Issue(t, ca.Dir(t), "localhost")
	type env = map[string]string
	for _, tc := range []struct {
		name      string
		env       env
		given     string // a drip setting given
		listen    string // --listen, when given
		ratelimit bool   // called as ratelimit
		check     func(*server.Config, *envoySettings) string
		err       string // a refusal, naming this
	}{
		{name: "single", env: env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis.redis.svc:6379"},
			check: storeURL("redis://redis.redis.svc:6379")},
		{name: "auth and TLS", env: env{"REDIS_SOCKET_TYPE": "TCP", "REDIS_URL": "r:6380", "REDIS_AUTH": "user:p@ss", "REDIS_TLS": "true", "REDIS_TLS_CACERT": "/ca.pem", "REDIS_TLS_CLIENT_CERT": "/c.pem", "REDIS_TLS_CLIENT_KEY": "/k.pem"},
			check: storeURL("rediss://user:p%40ss@r:6380?tls_ca_file=%2Fca.pem&tls_cert_file=%2Fc.pem&tls_key_file=%2Fk.pem")},
		{name: "password only", env: env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_AUTH": "secret"},
			check: storeURL("redis://:secret@r:6379")},
		{name: "sentinel", env: env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,s1:26379,s2:26379"},
			check: storeURL("redis+sentinel://s1:26379,s2:26379/mymaster")},
		{name: "cluster", env: env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "CLUSTER", "REDIS_URL": "n1:7000,n2:7001,n3:7002"},
			check: storeURL("redis://n1:7000?addr=n2%3A7001&addr=n3%3A7002")},
		{name: "pipeline", env: env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_PIPELINE_WINDOW": "150us", "REDIS_PIPELINE_LIMIT": "8", "REDIS_POOL_SIZE": "10"},
			check: func(c *server.Config, s *envoySettings) string {
				if s.batching == nil || s.batching.Window != 150*time.Microsecond || s.batching.MaxBatch != 8 || len(s.notes) != 1 {
					return fmt.Sprintf("%+v %q", s.batching, s.notes)
				}
				return ""
			}},
		{name: "unix socket", env: env{"RUNTIME_ROOT": "/data", "REDIS_URL": "/var/run/nutcracker/ratelimit.sock"}, err: "REDIS_SOCKET_TYPE"},
		{name: "a platform's REDIS_URL", env: env{"REDIS_URL": "redis://h:6379", "LOG_LEVEL": "verbose"}, // Heroku's, say: not read
			check: func(c *server.Config, s *envoySettings) string {
				if c.Store != "" || len(s.notes) != 2 {
					return fmt.Sprintf("store %q, notes %q", c.Store, s.notes)
				}
				return ""
			}},
		{name: "bad type", env: env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1", "REDIS_TYPE": "ring"}, err: "REDIS_TYPE"},
		{name: "skip hostname", env: env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1", "REDIS_TLS": "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"}, err: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"},
		{name: "TLS file without TLS", env: env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1", "REDIS_TLS_CACERT": "/ca"}, err: "REDIS_TLS_CACERT"},
		{name: "per second", env: env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1", "REDIS_PERSECOND": "true"}, err: "REDIS_PERSECOND"},
		{name: "store twice", env: env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:1"}, given: "store", err: "REDIS_URL and --store"},
		{name: "redis setting without URL", env: env{"REDIS_AUTH": "x"}, err: "REDIS_AUTH"},
		{name: "memcache", env: env{"BACKEND_TYPE": "memcache"}, err: "BACKEND_TYPE"},
		{name: "xds", env: env{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "eg:18001", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
			"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "1s", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "5s",
			"XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "0.2", "XDS_CLIENT_BACKOFF_JITTER": "false", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "a:1,b:2",
			"CONFIG_GRPC_XDS_NODE_METADATA": "zone:z1", "RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit"},
			check: func(c *server.Config, _ *envoySettings) string {
				x := c.XDS
				if x == nil || x.Server != "eg:18001" || x.NodeID != "envoy-ratelimit" || !c.XDSForceStart || x.TLS != nil ||
					x.Backoff != (xds.Backoff{Initial: time.Second, Max: 5 * time.Second, RandomFactor: 0.2}) ||
					x.Headers["b"] != "2" || x.NodeMetadata["zone"] != "z1" || c.Rules != "" {
					return fmt.Sprintf("%+v rules %q", x, c.Rules)
				}
				if c.GRPCListen != "0.0.0.0:8081" || c.HealthListen != "0.0.0.0:8080" || c.Listen != "off" {
					return fmt.Sprintf("listeners: grpc %q health %q api %q", c.GRPCListen, c.HealthListen, c.Listen)
				}
				return ""
			}},
		{name: "xds defaults", env: env{"CONFIG_TYPE": "GRPC_XDS_SOTW"},
			check: func(c *server.Config, _ *envoySettings) string {
				if c.XDS.Server != "localhost:18000" || c.XDS.NodeID != "default" || c.XDS.Backoff != xds.DefaultBackoff || c.XDSForceStart {
					return fmt.Sprintf("%+v", c.XDS)
				}
				return ""
			}},
		{name: "xds TLS", env: env{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": cert,
			"CONFIG_GRPC_XDS_CLIENT_TLS_KEY": key, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": ca.CAFile, "CONFIG_GRPC_XDS_SERVER_TLS_SAN": "envoy-gateway"},
			check: func(c *server.Config, _ *envoySettings) string {
				if c.XDS.TLS == nil || c.XDS.TLS.RootCAs == nil || c.XDS.TLS.GetClientCertificate == nil || c.XDS.TLS.ServerName != "envoy-gateway" {
					return fmt.Sprintf("%+v", c.XDS.TLS)
				}
				return ""
			}},
		{name: "xds with --rules", env: env{"CONFIG_TYPE": "GRPC_XDS_SOTW"}, given: "rules", err: "--rules"},
		{name: "xds setting without xds", env: env{"CONFIG_GRPC_XDS_SERVER_URL": "eg:18001"}, err: "CONFIG_GRPC_XDS_SERVER_URL"},
		{name: "xds TLS file without TLS", env: env{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/ca"}, err: "CONFIG_GRPC_XDS_SERVER_USE_TLS"},
		{name: "xds random factor", env: env{"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "2"}, err: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR"},
		{name: "config type", env: env{"CONFIG_TYPE": "GRPC_XDS_DELTA"}, err: "CONFIG_TYPE"},
		{name: "grpc mutual TLS", env: env{"GRPC_PORT": "8081", "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": cert, "GRPC_SERVER_TLS_KEY": key, "GRPC_CLIENT_TLS_CACERT": ca.CAFile, "GRPC_CLIENT_TLS_SAN": "envoy"},
			check: func(c *server.Config, _ *envoySettings) string {
				if c.GRPCTLS == nil || c.GRPCTLS.ClientAuth != tls.RequireAndVerifyClientCert || c.GRPCTLS.VerifyConnection == nil {
					return fmt.Sprintf("%+v", c.GRPCTLS)
				}
				return ""
			}},
		{name: "grpc TLS, Envoy Gateway's CA name", env: env{"GRPC_PORT": "8081", "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": cert, "GRPC_SERVER_TLS_KEY": key, "GRPC_SERVER_TLS_CA_CERT": ca.CAFile},
			check: func(c *server.Config, _ *envoySettings) string {
				if c.GRPCTLS == nil || c.GRPCTLS.ClientAuth != tls.RequireAndVerifyClientCert {
					return fmt.Sprintf("%+v", c.GRPCTLS)
				}
				return ""
			}},
		{name: "grpc TLS without a key", env: env{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": cert}, err: "GRPC_SERVER_TLS_KEY"},
		{name: "grpc TLS file without TLS", env: env{"GRPC_SERVER_TLS_CERT": cert}, err: "GRPC_SERVER_USE_TLS"},
		{name: "grpc TLS without a gRPC listener", env: env{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": cert, "GRPC_SERVER_TLS_KEY": key, "GRPC_SERVER_TLS_CA_CERT": ca.CAFile},
			err: "no gRPC listener for it to guard"},
		{name: "grpc uds", env: env{"GRPC_UDS": "/tmp/rl.sock"}, err: "GRPC_UDS"},
		{name: "grpc connection age", env: env{"GRPC_MAX_CONNECTION_AGE": "1h", "GRPC_MAX_CONNECTION_AGE_GRACE": "30s"},
			check: func(c *server.Config, _ *envoySettings) string {
				if c.GRPCLimits.MaxConnectionAge != time.Hour || c.GRPCLimits.MaxConnectionAgeGrace != 30*time.Second {
					return fmt.Sprintf("%+v", c.GRPCLimits)
				}
				return ""
			}},
		{name: "port", env: env{"CONFIG_TYPE": "FILE", "HOST": "127.0.0.1", "PORT": "9999"}, given: "listen",
			check: func(c *server.Config, _ *envoySettings) string {
				if c.HealthListen != "127.0.0.1:9999" || c.Listen == "off" || c.GRPCListen != "0.0.0.0:8081" {
					return fmt.Sprintf("health %q api %q grpc %q", c.HealthListen, c.Listen, c.GRPCListen)
				}
				return ""
			}},
		{name: "port as ratelimit", env: env{}, ratelimit: true,
			check: func(c *server.Config, _ *envoySettings) string {
				if c.HealthListen != "0.0.0.0:8080" || c.Listen != "off" || c.GRPCListen != "0.0.0.0:8081" {
					return fmt.Sprintf("health %q api %q grpc %q", c.HealthListen, c.Listen, c.GRPCListen)
				}
				return ""
			}},
		{name: "a platform's PORT", env: env{"PORT": "8080"}, // Cloud Run, Heroku, ...: not read
			check: func(c *server.Config, _ *envoySettings) string {
				if c.HealthListen != "" || c.Listen != "" || c.GRPCListen != "" {
					return fmt.Sprintf("health %q api %q grpc %q", c.HealthListen, c.Listen, c.GRPCListen)
				}
				return ""
			}},
		{name: "port shared", env: env{"CONFIG_TYPE": "FILE"}, given: "listen", listen: "0.0.0.0:8080", err: "share port 8080"},
		{name: "bad port", env: env{"CONFIG_TYPE": "FILE", "PORT": "http"}, err: "PORT"},
		{name: "debug port", env: env{"USE_STATSD": "false", "DEBUG_PORT": "6070"},
			check: func(c *server.Config, _ *envoySettings) string {
				if c.AdminListen != "0.0.0.0:6070" {
					return c.AdminListen
				}
				return ""
			}},
		{name: "prometheus", env: env{"USE_STATSD": "false", "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001"},
			check: func(c *server.Config, _ *envoySettings) string {
				if c.AdminListen != ":19001" {
					return c.AdminListen
				}
				return ""
			}},
		{name: "prometheus and --admin-listen", env: env{"USE_STATSD": "false", "USE_PROMETHEUS": "true"}, given: "admin-listen",
			check: func(c *server.Config, _ *envoySettings) string {
				if c.AdminListen != "" {
					return c.AdminListen
				}
				return ""
			}},
		{name: "prometheus and debug", env: env{"USE_STATSD": "false", "USE_PROMETHEUS": "true", "DEBUG_PORT": "6070"}, err: "DEBUG_PORT"},
		{name: "prometheus path", env: env{"USE_STATSD": "false", "USE_PROMETHEUS": "true", "PROMETHEUS_PATH": "/stats"}, err: "PROMETHEUS_PATH"},
		{name: "statsd", env: env{"USE_STATSD": "true"}, err: "USE_STATSD"},
		{name: "statsd off", env: env{"USE_STATSD": "false"}, check: func(*server.Config, *envoySettings) string { return "" }},
		{name: "tracing", env: env{"USE_STATSD": "false", "TRACING_ENABLED": "true"}, err: "OTEL_"},
		{name: "log", env: env{"USE_STATSD": "false", "LOG_LEVEL": "DEBUG", "LOG_FORMAT": "json"},
			check: func(_ *server.Config, s *envoySettings) string {
				if s.level != slog.LevelDebug || !s.json {
					return fmt.Sprintf("%v %v", s.level, s.json)
				}
				return ""
			}},
		{name: "log level", env: env{"USE_STATSD": "false", "LOG_LEVEL": "loud"}, err: "LOG_LEVEL"},
		{name: "log format", env: env{"USE_STATSD": "false", "LOG_FORMAT": "xml"}, err: "LOG_FORMAT"},
		{name: "no effect", env: env{"NEAR_LIMIT_RATIO": "0.9", "EXPIRATION_JITTER_MAX_SECONDS": "300"},
			check: func(_ *server.Config, s *envoySettings) string {
				if len(s.notes) != 2 {
					return fmt.Sprintf("%q", s.notes)
				}
				return ""
			}},
		{name: "local cache", env: env{"LOCAL_CACHE_SIZE_IN_BYTES": "1048576"},
			check: func(c *server.Config, s *envoySettings) string {
				if c.DenialBytes != 1048576 || len(s.notes) != 0 {
					return fmt.Sprintf("bytes %d, notes %q", c.DenialBytes, s.notes)
				}
				return ""
			}},
		{name: "local cache off", env: env{"LOCAL_CACHE_SIZE_IN_BYTES": "0"},
			check: func(c *server.Config, _ *envoySettings) string {
				if c.DenialBytes >= 0 {
					return fmt.Sprintf("bytes %d: on", c.DenialBytes)
				}
				return ""
			}},
		{name: "local cache by default", env: env{"USE_STATSD": "false"},
			check: func(c *server.Config, _ *envoySettings) string {
				if c.DenialBytes != 0 {
					return fmt.Sprintf("bytes %d, want 0 (the default, on)", c.DenialBytes)
				}
				return ""
			}},
		{name: "near limit ratio", env: env{"NEAR_LIMIT_RATIO": "2"}, err: "NEAR_LIMIT_RATIO"},
		{name: "cache size", env: env{"LOCAL_CACHE_SIZE_IN_BYTES": "-1"}, err: "LOCAL_CACHE_SIZE_IN_BYTES"},
		{name: "cache key prefix", env: env{"CACHE_KEY_PREFIX": "rl_"}, err: "CACHE_KEY_PREFIX"},
		{name: "healthy with config", env: env{"CONFIG_TYPE": "GRPC_XDS_SOTW", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true"},
			check: func(c *server.Config, _ *envoySettings) string {
				if !c.HealthNeedsConfig {
					return "not set"
				}
				return ""
			}},
		// Misspelt names: refused, naming the nearest known one.
		{name: "client CA, misspelt", env: env{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": cert, "GRPC_SERVER_TLS_KEY": key, "GRPC_CLIENT_TLS_CA_CERT": "/ca.pem"},
			err: "GRPC_CLIENT_TLS_CA_CERT is set, but neither envoyproxy/ratelimit nor drip has such a variable: did you mean GRPC_CLIENT_TLS_CACERT?"},
		{name: "client CA, misspelt, in a deployment", env: env{"CONFIG_TYPE": "FILE", "GRPC_CLIENT_TLS_CA_CERT": "/ca.pem"}, ratelimit: true,
			err: "did you mean GRPC_CLIENT_TLS_CACERT?"},
		{name: "SAN, misspelt", env: env{"GRPC_CLIENT_TLS_SANS": "envoy"}, err: "GRPC_CLIENT_TLS_SANS is set, but neither envoyproxy/ratelimit nor drip has such a variable: did you mean GRPC_CLIENT_TLS_SAN?"},
		{name: "REDIS_URL, misspelt", env: env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URI": "r:6379"}, err: "REDIS_URI is set, but neither envoyproxy/ratelimit nor drip has such a variable: did you mean REDIS_URL?"},
		{name: "xDS, misspelt", env: env{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_TLS_CA_CERT": "/ca.pem"}, err: "did you mean CONFIG_GRPC_XDS_SERVER_TLS_CACERT?"},
		{name: "memcache, misspelt", env: env{"RUNTIME_ROOT": "/data", "MEMCACHE_HOSTPORT": "m:11211"}, err: "did you mean MEMCACHE_HOST_PORT?"},
		{name: "runtime, misspelt", env: env{"RUNTIME_IGNORE_DOTFILES": "true"}, err: "did you mean RUNTIME_IGNOREDOTFILES?"},
		{name: "REDIS_SOCKET_TYPE without REDIS_URL", env: env{"REDIS_SOCKET_TYPE": "tcp"}, err: "REDIS_SOCKET_TYPE=tcp says the store is Redis, but REDIS_URL is not set"},
		{name: "REDIS_SOCKET_TYPE and --store", env: env{"REDIS_SOCKET_TYPE": "tcp"}, given: "store",
			check: func(c *server.Config, s *envoySettings) string { return "" }},
		// Others' names beside them: accepted.
		{name: "others' names", env: env{"CONFIG_TYPE": "FILE", "GRPC_GO_LOG_SEVERITY_LEVEL": "info", "GRPC_XDS_BOOTSTRAP": "/b.json",
			"REDIS_SERVICE_HOST": "10.0.0.1", "REDIS_SERVICE_PORT": "6379", "REDIS_PORT": "tcp://10.0.0.1:6379", "REDIS_PORT_6379_TCP_ADDR": "10.0.0.1",
			"MEMCACHE_PORT": "udp://10.0.0.2:11211"},
			check: func(c *server.Config, s *envoySettings) string { return "" }},
		{name: "a platform's REDIS_TLS_URL", env: env{"REDIS_URL": "redis://h:6379", "REDIS_TLS_URL": "rediss://h:6380"},
			check: func(c *server.Config, s *envoySettings) string { return "" }},
		{name: "a REDIS_PORT that is not a Service's", env: env{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_PORT": "6380"}, err: "REDIS_PORT is set"},
		// Inert names: accepted, noted in the log.
		{name: "inert", env: env{"CONFIG_TYPE": "FILE", "STATSD_HOST": "statsd", "MEMCACHE_HOST_PORT": "m:11211", "TRACING_SERVICE_NAME": "rl"},
			check: func(c *server.Config, s *envoySettings) string {
				if len(s.notes) != 3 || !strings.Contains(strings.Join(s.notes, "\n"), "MEMCACHE_HOST_PORT tunes envoyproxy/ratelimit's memcache backend") {
					return fmt.Sprintf("notes %q", s.notes)
				}
				return ""
			}},
		{name: "headers", env: env{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_REMAINING_HEADER": "X-Left"},
			check: func(c *server.Config, _ *envoySettings) string {
				if c.Envoy.Headers != (envoy.Headers{Mode: envoy.HeadersEnvoy, Remaining: "X-Left"}) {
					return fmt.Sprintf("%+v", c.Envoy.Headers)
				}
				return ""
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := server.Config{Listen: tc.listen}
			st, err := envoyEnv(&c, environOf(tc.env), func(f string) bool { return f == tc.given }, tc.ratelimit)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if msg := tc.check(&c, st); msg != "" {
				t.Fatal(msg)
			}
		})
	}
}

// storeURL checks the store URL made of REDIS_*.
func storeURL(want string) func(*server.Config, *envoySettings) string {
	return func(c *server.Config, _ *envoySettings) string {
		if c.Store != want {
			return fmt.Sprintf("store %q, want %q", c.Store, want)
		}
		if _, err := redisstore.ParseURL(c.Store); err != nil && !strings.Contains(err.Error(), "no such file") {
			return fmt.Sprintf("store %q: %v", c.Store, err)
		}
		return ""
	}
}

// TestRatelimitEnvDocumented: every envoyproxy/ratelimit variable drip
// reads has its line in docs/envoy.md.
func TestRatelimitEnvDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`"([A-Z][A-Z0-9_]{2,})"`)
	n := 0
	for _, f := range []string{"serve_envoy.go", "envoy_names.go", "../../server/envoy/options.go"} {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			name := m[1]
			if strings.HasPrefix(name, "DRIP_") || strings.HasSuffix(name, "_") || name == "FILE" || name == "GRPC_XDS_SOTW" {
				continue
			}
			n++
			if !strings.Contains(string(doc), "`"+name+"`") {
				t.Errorf("%s reads %s: not in docs/envoy.md", f, name)
			}
		}
	}
	if n < 50 {
		t.Fatalf("found only %d variables: the pattern no longer matches the code", n)
	}
}

// TestHasSAN: GRPC_CLIENT_TLS_SAN matches a name the certificate
// carries, and no other.
func TestHasSAN(t *testing.T) {
	ca := testserver.NewCA(t, "san")
	certFile, keyFile := ca.Issue(t, ca.Dir(t), "envoy", "10.0.0.1")
	kp, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"envoy": true, "10.0.0.1": true, "envoy-gateway": false, "": false, "10.0.0.2": false} {
		if got := hasSAN(cert, name); got != want {
			t.Errorf("hasSAN(%q) = %v", name, got)
		}
	}
}

// TestGRPCServerTLS: the TLS the gRPC listener gets from GRPC_* asks for
// a client certificate of the CA carrying GRPC_CLIENT_TLS_SAN, and takes
// no other.
func TestGRPCServerTLS(t *testing.T) {
	ca := testserver.NewCA(t, "grpc")
	srvCert, srvKey := ca.Issue(t, ca.Dir(t), "envoy-ratelimit")
	envoyCert, envoyKey := ca.Issue(t, ca.Dir(t), "envoy")
	otherCert, otherKey := ca.Issue(t, ca.Dir(t), "someone-else")
	e := map[string]string{"GRPC_PORT": "8081", "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": srvCert, "GRPC_SERVER_TLS_KEY": srvKey,
		"GRPC_CLIENT_TLS_CACERT": ca.CAFile, "GRPC_CLIENT_TLS_SAN": "envoy"}
	var c server.Config
	if _, err := envoyEnv(&c, environOf(e), none, false); err != nil {
		t.Fatal(err)
	}
	addr := tlsVerdicts(t, c.GRPCTLS)
	pool, err := certPool(ca.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(certs ...tls.Certificate) error {
		return tlsVerdict(addr, &tls.Config{RootCAs: pool, ServerName: "envoy-ratelimit", Certificates: certs})
	}
	pair := func(c, k string) tls.Certificate {
		kp, err := tls.LoadX509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	if err := dial(pair(envoyCert, envoyKey)); err != nil {
		t.Fatalf("envoy's certificate: %v", err)
	}
	if err := dial(pair(otherCert, otherKey)); err == nil {
		t.Fatal("a certificate without the SAN was taken")
	}
	if err := dial(); err == nil {
		t.Fatal("no certificate was taken")
	}
}

// TestKeyPairRotates: a certificate replaced in its files (a rotated
// Secret) is served from the next check on, a second later at most.
func TestKeyPairRotates(t *testing.T) {
	ca := testserver.NewCA(t, "rotate")
	dir := ca.Dir(t)
	certFile, keyFile := ca.Issue(t, dir, "envoy-ratelimit")
	r := newTLSReloads()
	k, err := keyPair(r, "GRPC_SERVER_TLS_CERT", certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(time.Hour) // past the first read's second
	r.now = func() time.Time { return at }
	first, _ := k.get()
	ca.Issue(t, dir, "envoy-ratelimit") // the same files, a new certificate
	if got, _ := k.get(); string(got.Certificate[0]) != string(first.Certificate[0]) {
		t.Fatal("read again within the second")
	}
	at = at.Add(time.Second)
	if got, _ := k.get(); string(got.Certificate[0]) == string(first.Certificate[0]) {
		t.Fatal("the new certificate is not served")
	}
}

// TestTLSFilesRotate runs the gRPC listener's TLS, as GRPC_* make it, on
// real files rotated under it, with the reload clock injected: the client
// CA file is read again like the certificate (a client of the new CA is
// taken, one of the old refused, from the next check on), and a change
// that does not load keeps what is in force, logged and counted once.
func TestTLSFilesRotate(t *testing.T) {
	oldCA, newCA := testserver.NewCA(t, "old"), testserver.NewCA(t, "new")
	srvCert, srvKey := oldCA.Issue(t, oldCA.Dir(t), "envoy-ratelimit")
	envoyOld, keyOld := oldCA.Issue(t, oldCA.Dir(t), "envoy")
	envoyNew, keyNew := newCA.Issue(t, newCA.Dir(t), "envoy")
	caFile := filepath.Join(t.TempDir(), "ca.crt") // the Secret's ca.crt
	copyFile := func(from, to string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(oldCA.CAFile, caFile)
	var c server.Config
	st, err := envoyEnv(&c, environOf(map[string]string{"GRPC_PORT": "8081", "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": srvCert,
		"GRPC_SERVER_TLS_KEY": srvKey, "GRPC_SERVER_TLS_CA_CERT": caFile}), none, false)
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	st.tls.log = slog.New(slog.NewTextHandler(&logs, nil))
	at := time.Now().Add(time.Hour)
	st.tls.now = func() time.Time { return at }
	if !slices.Equal(st.tls.names, []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_CA_CERT"}) {
		t.Fatalf("watched: %q", st.tls.names)
	}

	addr := tlsVerdicts(t, c.GRPCTLS)
	roots := x509.NewCertPool()
	for _, f := range []string{oldCA.CAFile, newCA.CAFile} { // the server's certificate stays the old CA's
		b, _ := os.ReadFile(f)
		roots.AppendCertsFromPEM(b)
	}
	dial := func(cert, key string) error {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		return tlsVerdict(addr, &tls.Config{RootCAs: roots, ServerName: "envoy-ratelimit", Certificates: []tls.Certificate{kp}})
	}
	count := func(files, result string) float64 {
		var m dto.Metric
		if err := st.tls.count.WithLabelValues(files, result).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}

	if err := dial(envoyOld, keyOld); err != nil {
		t.Fatalf("the old CA's client: %v", err)
	}
	copyFile(newCA.CAFile, caFile) // rotated
	if err := dial(envoyOld, keyOld); err != nil {
		t.Fatalf("within the second, the old CA's client: %v", err)
	}
	at = at.Add(time.Second)
	if err := dial(envoyNew, keyNew); err != nil {
		t.Fatalf("the new CA's client, after the rotation: %v", err)
	}
	if err := dial(envoyOld, keyOld); err == nil {
		t.Fatal("the old CA's client is still taken after the rotation")
	}
	if count("GRPC_SERVER_TLS_CA_CERT", "ok") != 1 {
		t.Fatalf("CA reloads ok: %v, want 1", count("GRPC_SERVER_TLS_CA_CERT", "ok"))
	}

	// A CA file and a certificate that do not load: kept, counted once each.
	os.WriteFile(caFile, []byte("not a certificate"), 0o600)
	os.WriteFile(srvCert, []byte("-----BEGIN CERTIFICATE-----\ntruncated"), 0o600)
	for range 3 {
		at = at.Add(time.Second)
		if err := dial(envoyNew, keyNew); err != nil {
			t.Fatalf("after a bad rotation: %v (the files in force must be kept)", err)
		}
	}
	for _, f := range []string{"GRPC_SERVER_TLS_CA_CERT", "GRPC_SERVER_TLS_CERT"} {
		if n := count(f, "error"); n != 1 {
			t.Errorf("%s reload errors: %v, want 1 (once per change)", f, n)
		}
		if !strings.Contains(logs.String(), "level=WARN msg=\"drip serve: TLS files changed but do not load; the ones in force are kept\" variable="+f) {
			t.Errorf("no warning about %s in the log:\n%s", f, logs.String())
		}
	}
}

// environOf is env in os.Environ's form.
func environOf(env map[string]string) []string {
	var kv []string
	for k, v := range env {
		kv = append(kv, k+"="+v)
	}
	return kv
}

// tlsVerdicts listens on a loopback port with cfg until the test ends,
// and sends each client one byte once its handshake is done.
func tlsVerdicts(t *testing.T, cfg *tls.Config) string {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.(*tls.Conn).Handshake()
			conn.Write([]byte("x"))
			conn.Close()
		}
	}()
	return ln.Addr().String()
}

// tlsVerdict connects to addr with cfg: nil when the server took it.
func tlsVerdict(addr string, cfg *tls.Config) error {
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Read(make([]byte, 1)) // TLS 1.3: the server's verdict comes with the first read
	return err
}

// TestXDSCARotates: CONFIG_GRPC_XDS_SERVER_TLS_CACERT is read again when
// it changes, as the client certificate is: the xDS client's RootCAs
// give the new CA's pool from the next check on (it was read once, at
// start, so a rotated CA cut drip off its xDS server until a restart).
func TestXDSCARotates(t *testing.T) {
	oldCA, newCA := testserver.NewCA(t, "old"), testserver.NewCA(t, "new")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	write := func(from string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(caFile, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(oldCA.CAFile)
	var c server.Config
	st, err := envoyEnv(&c, environOf(map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "127.0.0.1:18000",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": caFile}), none, false)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(time.Hour)
	st.tls.now = func() time.Time { return at }
	if c.XDS == nil || c.XDS.RootCAs == nil || !slices.Contains(st.tls.names, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT") {
		t.Fatalf("the xDS CA file is not watched: %+v, watched %q", c.XDS, st.tls.names)
	}
	signs := func(ca *testserver.CA) bool { // the pool in force takes a certificate of ca
		certFile, _ := ca.Issue(t, ca.Dir(t), "xds")
		b, _ := os.ReadFile(certFile)
		blk, _ := pem.Decode(b)
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		pool, err := c.XDS.RootCAs()
		if err != nil {
			t.Fatal(err)
		}
		_, err = cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "xds"})
		return err == nil
	}
	if !signs(oldCA) || signs(newCA) {
		t.Fatal("before the rotation, the pool is not the old CA's")
	}
	write(newCA.CAFile)
	at = at.Add(time.Second)
	if signs(oldCA) || !signs(newCA) {
		t.Fatal("after the rotation, the pool is not the new CA's")
	}
}
