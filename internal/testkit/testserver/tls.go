package testserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// CA is a throwaway certificate authority for TLS tests: its certificate
// in a PEM file (CAFile) to give clients, and a key that signs server
// certificates.
type CA struct {
	CAFile string
	dir    string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
}

// NewCA makes a CA whose files live in a directory of the test's own that
// a server running as the postgres user can read.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	dir, err := os.MkdirTemp("", "drip-tls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &CA{dir: dir, cert: cert, key: key, CAFile: filepath.Join(dir, name+"-ca.pem")}
	writePEM(t, ca.CAFile, "CERTIFICATE", der, 0o644)
	return ca
}

// Issue makes a server (and client) certificate for hosts (DNS names, or IP addresses)
// and writes it and its key as PEM files into dir, as server.crt and
// server.key, replacing any there. The key is readable by its owner only:
// the postgres user when the tests run as root (PostgreSQL insists).
func (ca *CA) Issue(t testing.TB, dir string, hosts ...string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, // a client certificate too (mutual TLS)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	writePEM(t, certFile, "CERTIFICATE", der, 0o644)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder, 0o600)
	if os.Geteuid() == 0 {
		if u, err := user.Lookup("postgres"); err == nil {
			uid, _ := strconv.Atoi(u.Uid)
			gid, _ := strconv.Atoi(u.Gid)
			os.Chown(keyFile, uid, gid)
		}
	}
	return certFile, keyFile
}

// Dir is a fresh directory for server certificates, readable by a server
// running as the postgres user, removed with the CA's.
func (ca *CA) Dir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp(ca.dir, "server-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func writePEM(t testing.TB, path, kind string, der []byte, mode os.FileMode) {
	t.Helper()
	os.Remove(path)
	b := pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
}

// StartRedisTLS starts a redis-server of the test's own that serves TLS
// on a second port (the first stays plain, for the harness's redis-cli)
// with the certificate and key in certFile and keyFile, read again at
// every Start. It returns the server and its TLS port.
func StartRedisTLS(t testing.TB, certFile, keyFile string) (*Redis, int) {
	t.Helper()
	port := FreePort(t, 0)
	r := StartRedis(t, "--tls-port", strconv.Itoa(port), "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-auth-clients", "no")
	return r, port
}

// StartPostgresTLS starts a PostgreSQL server of the test's own with
// ssl=on and the certificate and key in certFile and keyFile (read again
// at every Start), stopped and removed when the test ends.
func StartPostgresTLS(t testing.TB, certFile, keyFile string) *Postgres {
	t.Helper()
	p, err := NewPostgres("ssl=on", "ssl_cert_file="+certFile, "ssl_key_file="+keyFile)
	if err != nil {
		if err == errMissing {
			Missing(t, "%v", err)
		}
		t.Fatalf("start postgres: %v", err)
	}
	t.Cleanup(func() { p.Stop(); p.Remove() })
	return p
}
