package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/driplimit/drip/store/memstore"
)

// drainRules: a rule on the API key, and forward auth trusting the tests'
// loopback proxy.
const drainRules = `{"trusted_proxies": ["127.0.0.1/32"], "rules": [
  {"name": "api", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 100, "period": "1s", "burst": 100}}]}`

// sender is one client of TestDrain: the same request, again and again,
// on a keep-alive connection of its own.
type sender struct {
	method, url, body string
	hdr               map[string]string
}

// TestDrain: 16 clients send continuously on keep-alive connections to
// every HTTP listener (the decision API, forward auth, the admin
// listener's /json and /metrics; the gateway) when the server is told to
// stop. Every request sent before the drain ends gets a full answer, and
// none fails on a connection the server kept alive: while the server
// drains, each answer closes its connection, /readyz answers 503,
// /healthcheck 500 and gRPC health NOT_SERVING, while calls are still
// served. Once the test ends the drain, a new connection may fail
// (refused, or reset in the accept queue): that is all.
func TestDrain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, drainRules)
	take := func(base string, i int) sender {
		return sender{method: "POST", url: base + "/v1/take", body: fmt.Sprintf(`{"rule": "api", "values": ["c%d"]}`, i)}
	}
	envoyJSON := func(admin string) sender {
		return sender{method: "POST", url: admin + "/json", body: `{"domain": "edge", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}`}
	}

	t.Run("decision API", func(t *testing.T) {
		srv := start(t, Config{Rules: path, WatchEvery: -1, GRPCListen: "127.0.0.1:0", Drain: 10 * time.Minute}, memstore.New())
		var ss []sender
		for i := range 10 {
			ss = append(ss, take(srv.base, i))
		}
		for i := range 2 {
			ss = append(ss, sender{method: "GET", url: srv.base + "/v1/forward-auth", hdr: map[string]string{
				"X-Forwarded-Method": "GET", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "app.example",
				"X-Forwarded-Uri": "/a", "X-Api-Key": fmt.Sprint("f", i)}})
		}
		ss = append(ss, envoyJSON(srv.admin), envoyJSON(srv.admin),
			sender{method: "GET", url: srv.admin + "/metrics"}, sender{method: "GET", url: srv.admin + "/metrics"})
		rls, health := grpcClient(t, srv.Server)
		drainCheck(t, srv, ss, func() {
			// Load balancers are told, callers still served.
			if code, body := call(t, "GET", srv.admin+"/readyz", ""); code != 503 || !strings.Contains(body, "draining") {
				t.Errorf("/readyz while draining: %d %s, want 503 draining", code, body)
			}
			if code, body := call(t, "GET", srv.admin+"/healthcheck", ""); code != 500 {
				t.Errorf("/healthcheck while draining: %d %s, want 500", code, body)
			}
			if resp, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Errorf("gRPC health while draining: %v %v, want NOT_SERVING", resp, err)
			}
			shouldRateLimit(t, rls, "192.0.2.1") // fails the test on an error
		})
	})

	t.Run("gateway", func(t *testing.T) {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, "upstream")
		}))
		t.Cleanup(up.Close)
		srv := start(t, Config{Rules: path, WatchEvery: -1, Upstream: up.URL, Drain: 10 * time.Minute}, memstore.New())
		var ss []sender
		for i := range 14 {
			ss = append(ss, sender{method: "POST", url: srv.base + "/upload", body: "payload",
				hdr: map[string]string{"X-Api-Key": fmt.Sprint("g", i)}})
		}
		ss = append(ss, envoyJSON(srv.admin), envoyJSON(srv.admin))
		drainCheck(t, srv, ss, func() {
			if code, body := call(t, "GET", srv.admin+"/readyz", ""); code != 503 {
				t.Errorf("/readyz while draining: %d %s, want 503", code, body)
			}
		})
	})
}

// drainCheck runs the senders until each has an answer on a keep-alive
// connection, stops srv, waits until each has been told to close its
// connection, calls during (checks made while it drains), ends the drain
// and waits for Serve to return; then no request may have failed but on
// a new connection after the drain.
func drainCheck(t *testing.T, srv *running, ss []sender, during func()) {
	t.Helper()
	var ended atomic.Bool // the test has ended the drain
	var mu sync.Mutex
	var failures []string
	fail := func(s string) {
		mu.Lock()
		failures = append(failures, s)
		mu.Unlock()
	}
	t.Cleanup(srv.EndDrain) // before the cleanup that stops srv, should the test end early

	warm, told, done := make([]chan struct{}, len(ss)), make([]chan struct{}, len(ss)), make([]chan struct{}, len(ss))
	var stopping atomic.Bool
	for i, s := range ss {
		warm[i], told[i], done[i] = make(chan struct{}), make(chan struct{}), make(chan struct{})
		client := &http.Client{Transport: &http.Transport{}}
		go func() {
			defer close(done[i])
			defer client.CloseIdleConnections()
			var warmed, wasTold bool
			for n := 0; ; n++ {
				reused := false
				ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
					GotConn: func(c httptrace.GotConnInfo) { reused = c.Reused },
				})
				ctx, cancel := context.WithTimeout(ctx, time.Minute) // generous: speed is not tested
				var body io.Reader
				if s.body != "" {
					body = strings.NewReader(s.body)
				}
				req, _ := http.NewRequestWithContext(ctx, s.method, s.url, body)
				for k, v := range s.hdr {
					req.Header.Set(k, v)
				}
				resp, err := client.Do(req)
				var b []byte
				if err == nil {
					b, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				cancel()
				if err != nil {
					if !reused && ended.Load() {
						return // a new connection after the drain: refused, or reset before it was accepted
					}
					fail(fmt.Sprintf("%s %s, request %d (connection reused %v, drain ended %v): %v", s.method, s.url, n+1, reused, ended.Load(), err))
					return
				}
				if !slices.Contains([]int{200, 429}, resp.StatusCode) {
					fail(fmt.Sprintf("%s %s, request %d: %d %s", s.method, s.url, n+1, resp.StatusCode, b))
					return
				}
				if !warmed && reused {
					warmed = true
					close(warm[i])
				}
				if !wasTold && resp.Close && stopping.Load() {
					wasTold = true
					close(told[i])
				}
			}
		}()
	}
	// waitAll waits until each sender has done what or stopped.
	waitAll := func(what string, chans []chan struct{}) {
		t.Helper()
		deadline := time.After(time.Minute) // generous: speed is not tested
		for i, c := range chans {
			select {
			case <-c:
			case <-done[i]:
			case <-deadline:
				t.Fatalf("%s %s: not within a minute", ss[i].url, what)
			}
		}
	}
	waitAll("answered on a reused connection", warm)
	stopping.Store(true)
	srv.cancel() // SIGTERM
	waitAll("told to close its connection", told)
	during()
	ended.Store(true)
	srv.EndDrain()
	if err := srv.stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	waitAll("stopped after the server", done)
	if len(failures) > 0 {
		t.Errorf("%d requests failed:\n%s", len(failures), strings.Join(failures, "\n"))
	}
}
