package xds_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/server/envoy"
	"github.com/driplimit/drip/server/envoy/xds"
	"github.com/driplimit/drip/server/envoy/xds/xdstest"
	"github.com/driplimit/drip/store/memstore"
)

// TestRootCAsEachConnection: Config.RootCAs is read at each connection.
// An xDS server whose certificate a new CA signed is refused while the
// client's CAs are the old one's, and followed from the first connection
// after they change, without a new client (a rotated CA file).
func TestRootCAsEachConnection(t *testing.T) {
	oldCA, newCA := testserver.NewCA(t, "old"), testserver.NewCA(t, "new")
	cert, key := newCA.Issue(t, newCA.Dir(t), "xds", "127.0.0.1")
	kp, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	srv := xdstest.Start(t, &tls.Config{Certificates: []tls.Certificate{kp}, MinVersion: tls.VersionTLS12})
	pool := func(file string) *x509.CertPool {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		p := x509.NewCertPool()
		p.AppendCertsFromPEM(b)
		return p
	}
	var roots atomic.Pointer[x509.CertPool]
	roots.Store(pool(oldCA.CAFile))
	var asked atomic.Int64
	svc := envoy.NewService(memstore.New(), nil)
	var applied atomic.Int64
	followConfig(t, xds.Config{Server: srv.Addr, NodeID: node,
		TLS:     &tls.Config{MinVersion: tls.VersionTLS12, ServerName: "xds"},
		RootCAs: func() (*x509.CertPool, error) { asked.Add(1); return roots.Load(), nil },
		Backoff: xds.Backoff{Initial: time.Millisecond, Max: 20 * time.Millisecond}}, svc, &applied)
	srv.Push(t, node, "1", xdstest.Config("api", "gw", xdstest.Limit("k", "", 0, rlconfv3.RateLimitUnit_SECOND)))
	deadline := time.Now().Add(time.Minute) // generous: how fast is not tested
	for asked.Load() < 3 {                  // refused at least twice over
		if time.Now().After(deadline) {
			t.Fatal("the client did not try to connect")
		}
		time.Sleep(time.Millisecond)
	}
	if applied.Load() != 0 || srv.Streams() != 0 {
		t.Fatalf("a server the client's CAs do not sign was followed: %d applied, %d streams", applied.Load(), srv.Streams())
	}
	roots.Store(pool(newCA.CAFile)) // the CA file rotated
	srv.WaitAck(t, "1")
	if got := code(t, svc, request("gw", "k", "x")); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("requests_per_unit 0 after the CAs changed: %v", got)
	}
}
