package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/driplimit/drip/internal/testkit/testserver"
)

// TestNoDecisionBesideMutualTLS runs drip as ratelimit with mutual TLS on
// its gRPC listener (Envoy Gateway's variables, certificates of a
// throwaway CA) and its admin listener moved by each variable that can
// move it (the image's DRIP_ADMIN_LISTEN, DEBUG_HOST and DEBUG_PORT,
// USE_PROMETHEUS). There, a client without a certificate gets no
// decision from POST /json (before: 200 200 200 429, after which Envoy's
// own calls were over the limit), while the probes answer and Envoy's
// calls, with their certificate, still decide on an untouched bucket.
func TestNoDecisionBesideMutualTLS(t *testing.T) {
	ca := testserver.NewCA(t, "envoy-gateway")
	srvCert, srvKey := ca.Issue(t, ca.Dir(t), "envoy-ratelimit", "127.0.0.1")
	envoyCert, envoyKey := ca.Issue(t, ca.Dir(t), "envoy", "127.0.0.1")
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(ca.CAFile)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA: %v", err)
	}
	envoyPair, err := tls.LoadX509KeyPair(envoyCert, envoyKey)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "ratelimit", "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(root, "ratelimit", "config", "gw.yaml"),
		"domain: gw\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 3}\n")

	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"the image's DRIP_ADMIN_LISTEN", map[string]string{"DRIP_ADMIN_LISTEN": "127.0.0.1:0"}},
		{"DEBUG_HOST and DEBUG_PORT", map[string]string{"DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0"}},
		{"USE_PROMETHEUS", map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range map[string]string{
				"RUNTIME_ROOT":            root,
				"RUNTIME_SUBDIRECTORY":    "ratelimit",
				"GRPC_SERVER_USE_TLS":     "true",
				"GRPC_SERVER_TLS_CERT":    srvCert,
				"GRPC_SERVER_TLS_KEY":     srvKey,
				"GRPC_SERVER_TLS_CA_CERT": ca.CAFile,
				"GRPC_HOST":               "127.0.0.1",
				"GRPC_PORT":               "0",
				"HOST":                    "127.0.0.1",
				"PORT":                    "0",
			} {
				t.Setenv(k, v)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			out := startServe(t, argsOf([]string{"/bin/ratelimit"})[1:]...)
			if !strings.Contains(out, "client certificates required") {
				t.Errorf("the startup lines do not say client certificates are required:\n%s", out)
			}
			m := adminRe.FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("no admin listener in:\n%s", out)
			}
			admin := "http://" + m[1]

			// A client without a certificate, on the admin listener.
			body := `{"domain": "gw", "descriptors": [{"entries": [{"key": "tenant", "value": "t1"}]}]}`
			var codes []int
			for range 4 {
				resp, err := http.Post(admin+"/json", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				codes = append(codes, resp.StatusCode)
			}
			for _, c := range codes {
				if c != http.StatusNotFound {
					t.Fatalf("POST /json without a certificate: %v, want 404 each time (no decision)", codes)
				}
			}
			// The probes still answer there, without a certificate.
			for _, p := range []string{"/healthz", "/readyz", "/healthcheck"} {
				if code, body := httpGet(t, admin+p); code != 200 {
					t.Errorf("GET %s: %d %q", p, code, body)
				}
			}

			// Envoy, with its certificate: the bucket is untouched.
			grpcAddr := grpcAnyRe.FindStringSubmatch(out)[1]
			conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
				RootCAs: pool, ServerName: "envoy-ratelimit", Certificates: []tls.Certificate{envoyPair}})))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "gw",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "t1"}}}}})
			if err != nil {
				t.Fatalf("Envoy's call, with its certificate: %v", err)
			}
			if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 {
				t.Fatalf("Envoy's first call: %s, %d remaining; want OK, 2 (3 an hour, nothing taken before)", resp.OverallCode, resp.Statuses[0].LimitRemaining)
			}
		})
	}
}

// TestDecisionAPIBesideMutualTLS: drip serve refuses a decision API (the
// image's DRIP_LISTEN, say) beside a gRPC listener that requires client
// certificates, naming --listen.
func TestDecisionAPIBesideMutualTLS(t *testing.T) {
	setMutualTLS(t, "GRPC_CLIENT_TLS_CACERT")
	refusedAtStart(t, []string{"--listen", "127.0.0.1:0", "--admin-listen", "off", "--grpc-listen", "127.0.0.1:0"}, "--listen off", "client certificates")
}

// TestNoMutualTLSWithoutGRPCListener: GRPC_SERVER_USE_TLS and a client CA
// with no gRPC listener to guard are refused at start, naming the
// variables that open one. Before, drip serve (the image's entrypoint)
// without GRPC_HOST, GRPC_PORT or CONFIG_TYPE, or ratelimit given an empty
// --grpc-listen, started without gRPC and without a word about TLS, and
// its admin listener's POST /json decided for any client in plaintext.
func TestNoMutualTLSWithoutGRPCListener(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"drip serve without GRPC_HOST, GRPC_PORT or CONFIG_TYPE", nil, nil},
		{"an empty --grpc-listen", map[string]string{"GRPC_PORT": "0"}, []string{"--grpc-listen="}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setMutualTLS(t, "GRPC_SERVER_TLS_CA_CERT")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			refusedAtStart(t, append([]string{"--listen", "off", "--admin-listen", "127.0.0.1:0"}, tc.args...), "GRPC_SERVER_USE_TLS", "GRPC_PORT")
		})
	}
}

// setMutualTLS sets envoyproxy/ratelimit's variables for a gRPC listener
// that requires client certificates of a throwaway CA, named by caVar.
func setMutualTLS(t *testing.T, caVar string) {
	ca := testserver.NewCA(t, "grpc")
	srvCert, srvKey := ca.Issue(t, ca.Dir(t), "envoy-ratelimit", "127.0.0.1")
	for k, v := range map[string]string{
		"GRPC_SERVER_USE_TLS":  "true",
		"GRPC_SERVER_TLS_CERT": srvCert,
		"GRPC_SERVER_TLS_KEY":  srvKey,
		caVar:                  ca.CAFile,
	} {
		t.Setenv(k, v)
	}
}

// refusedAtStart runs drip serve with args and wants it refused, its
// error saying each of wants. Were it served instead, the context's end
// would stop it (exit 0).
func refusedAtStart(t *testing.T, args []string, wants ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out, errs lockedBuffer
	code := run(ctx, append([]string{"serve", "--drain=0"}, args...), strings.NewReader(""), &out, &errs)
	ok := code != 0
	for _, w := range wants {
		ok = ok && strings.Contains(errs.String(), w)
	}
	if !ok {
		t.Fatalf("exit %d, want a refusal saying %q: %s%s", code, wants, out.String(), errs.String())
	}
}
