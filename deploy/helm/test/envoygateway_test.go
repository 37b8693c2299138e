package helmtest

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestEnvoyGatewayExampleSafe runs drip as examples/envoy-gateway.yaml's
// Deployment would (the image's environment, then the container's, Envoy
// Gateway's certificates from a throwaway CA in the mounted Secret, a real
// redis-server), with only the listen addresses moved to free loopback
// ports, and holds it to mutual TLS: no decision API, no POST /json on the
// admin port, no TLS session on the gRPC port without a client
// certificate, one with Envoy's; the probes still answer.
func TestEnvoyGatewayExampleSafe(t *testing.T) {
	r := render(t, filepath.Join(examplesDir, "envoy-gateway.yaml"))
	c := r.container(t)
	certs := t.TempDir()
	envoy := writeEnvoyGatewayCerts(t, certs)
	local := func(v string) string {
		if strings.HasPrefix(v, "/certs/") {
			return filepath.Join(certs, strings.TrimPrefix(v, "/certs/"))
		}
		return v
	}
	redis := startRedis(t)

	// The image's environment (moved to loopback), the container's, then
	// envoyproxy/ratelimit's listeners moved to free loopback ports.
	env := []string{"DRIP_LISTEN=127.0.0.1:0", "DRIP_ADMIN_LISTEN=127.0.0.1:0"}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+local(e.Value))
		case e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == "drip-redis":
			env = append(env, e.Name+"="+redis)
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			env = append(env, fmt.Sprintf("%s=%d", e.Name, c.Resources.Limits.Memory().Value()))
		default:
			t.Fatalf("env %s: a source the test does not know", e.Name)
		}
	}
	env = append(env, "HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0")

	cmd := exec.Command(dripBin, append([]string{"serve"}, c.Args...)...) // the image's ENTRYPOINT
	cmd.Env = env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	var out strings.Builder
	addrs := map[string]string{}
	patterns := map[string]*regexp.Regexp{
		"admin":  regexp.MustCompile(`metrics on http://(\S+)/metrics`),
		"grpc":   regexp.MustCompile(`gRPC\) on (\S+)`),
		"health": regexp.MustCompile(`/healthcheck on http://(\S+) \(PORT\)`),
	}
	sc := bufio.NewScanner(stdout)
	for len(addrs) < len(patterns) && sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		for name, re := range patterns {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrs[name] = m[1]
			}
		}
	}
	go io.Copy(io.Discard, stdout)
	if len(addrs) < len(patterns) {
		cmd.Wait()
		t.Fatalf("drip stopped before it listened: %v\n%s%s", addrs, out.String(), stderr.String())
	}
	if strings.Contains(out.String(), "decision API on") || !strings.Contains(out.String(), "client certificates required") {
		t.Errorf("want no decision API and client certificates required:\n%s", out.String())
	}

	for _, p := range [][2]string{{"admin", c.LivenessProbe.HTTPGet.Path}, {"admin", c.ReadinessProbe.HTTPGet.Path}, {"health", "/healthcheck"}} {
		resp, err := http.Get("http://" + addrs[p[0]] + p[1])
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s on %s: %d", p[1], p[0], resp.StatusCode)
		}
	}
	for _, l := range []string{"admin", "health"} {
		resp, err := http.Post("http://"+addrs[l]+"/json", "application/json",
			strings.NewReader(`{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("POST /json without a certificate on the %s port: %d, want 404 (no decision beside mutual TLS)", l, resp.StatusCode)
		}
	}

	// The gRPC port: a TLS session only with a certificate of the CA.
	dial := func(certs ...tls.Certificate) error {
		d := &net.Dialer{Timeout: 10 * time.Second}
		conn, err := tls.DialWithDialer(d, "tcp", addrs["grpc"], &tls.Config{RootCAs: envoy.pool, ServerName: "envoy-ratelimit", Certificates: certs, NextProtos: []string{"h2"}})
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
			return err
		}
		_, err = conn.Read(make([]byte, 1)) // TLS 1.3: the server's verdict comes with the first read
		return err
	}
	if err := dial(); err == nil {
		t.Error("the gRPC port took a client without a certificate")
	}
	if err := dial(envoy.cert); err != nil {
		t.Errorf("the gRPC port refused Envoy's certificate: %v", err)
	}
}

// envoyGatewayCA is what Envoy Gateway's certgen makes: the Secret
// envoy-rate-limit (ca.crt, tls.crt, tls.key, written to dir) and
// Envoy's own certificate of the same CA.
type envoyGatewayCA struct {
	pool *x509.CertPool
	cert tls.Certificate
}

func writeEnvoyGatewayCerts(t *testing.T, dir string) envoyGatewayCA {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "envoy-gateway"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, name string) ([]byte, []byte) {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	}
	srvCert, srvKey := issue(2, "envoy-ratelimit")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	for name, b := range map[string][]byte{"ca.crt": caPEM, "tls.crt": srvCert, "tls.key": srvKey} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	envoyCert, envoyKey := issue(3, "envoy")
	pair, err := tls.X509KeyPair(envoyCert, envoyKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return envoyGatewayCA{pool: pool, cert: pair}
}
