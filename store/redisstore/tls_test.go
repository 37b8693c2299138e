package redisstore_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

// TestTLS runs the suite's calls (storetest.RunTransport: the store is
// held to the whole suite by TestConformance) over rediss:// with a
// certificate from a throwaway CA, and wants a wrong CA or a wrong host name to fail at once
// with an error that says so.
func TestTLS(t *testing.T) {
	ca := testserver.NewCA(t, "drip-test")
	cert, key := ca.Issue(t, ca.Dir(t), "localhost")
	_, port := testserver.StartRedisTLS(t, cert, key)
	url := fmt.Sprintf("rediss://localhost:%d?tls_ca_file=%s", port, ca.CAFile)
	s := open(t, url)
	storetest.RunTransport(t, func(t *testing.T) store.Store { return s })

	other := testserver.NewCA(t, "other")
	for _, c := range []struct{ name, url, want string }{
		{"wrong CA", fmt.Sprintf("rediss://localhost:%d?tls_ca_file=%s", port, other.CAFile), "certificate signed by unknown authority"},
		{"wrong host", fmt.Sprintf("rediss://127.0.0.1:%d?tls_ca_file=%s", port, ca.CAFile), "127.0.0.1"},
		{"no CA (system roots)", fmt.Sprintf("rediss://localhost:%d", port), "certificate"},
		{"plain to TLS", fmt.Sprintf("redis://localhost:%d?dial_timeout=2s", port), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			begin := time.Now()
			s, err := redisstore.Open(c.url)
			took := time.Since(begin)
			if err == nil {
				s.Close()
				t.Fatalf("opened")
			}
			t.Logf("%v after %v", err, took.Round(time.Millisecond))
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
			// At once: a TLS failure is known at the handshake; generous
			// for a loaded machine, far below any hang.
			if took > 10*time.Second {
				t.Errorf("took %v to fail", took)
			}
		})
	}
}

// TestTLSSentinel runs the suite's calls (storetest.RunTransport) over
// rediss+sentinel://: the Sentinels,
// the master and the replica all serve TLS with a throwaway CA's
// certificate, and the client reaches each over TLS, checked against the
// host it is reached at.
func TestTLSSentinel(t *testing.T) {
	ca := testserver.NewCA(t, "drip-test")
	cert, key := ca.Issue(t, ca.Dir(t), "localhost", "127.0.0.1")
	rs := testserver.StartRedisSentinelTLS(t, ca.CAFile, cert, key)
	s := open(t, rs.URL()+"?tls_ca_file="+ca.CAFile)
	storetest.RunTransport(t, func(t *testing.T) store.Store { return s })
	other := testserver.NewCA(t, "other")
	if s, err := redisstore.Open(rs.URL() + "?tls_ca_file=" + other.CAFile); err == nil {
		s.Close()
		t.Fatal("opened with another CA")
	} else if !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("error %q does not say the certificate is not trusted", err)
	}
}
