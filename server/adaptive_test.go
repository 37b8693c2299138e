package server

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/memstore"
)

// TestGatewayAdaptive: drip serve's gateway with an adaptive rule: at
// its learned limit a request is a 503 naming its class; the limit, the
// requests in flight and the shedding by class are in the metrics and
// the admin rules listing; the decision API's take refuses the rule
// (its slots are acquired and released, slots.go).
func TestGatewayAdaptive(t *testing.T) {
	var hits atomic.Int64
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("X-Block") != "" {
			<-release
		}
	}))
	defer up.Close()
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"rules": [{"name": "up", "limit_keys": ["global"], "algorithm": "adaptive",
	  "priority_from": "header:x-priority", "algorithm_config": {"initial_limit": 2, "max_limit": 2}}]}`)
	const token = "adaptive-admin-token-0123456789"
	srv := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1, AdminToken: token}, memstore.New())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if code, body := call(t, "GET", srv.base+"/", "", "X-Block", "1"); code != 200 {
				t.Errorf("a request within the limit: %d %s", code, body)
			}
		})
	}
	defer func() {
		close(release)
		wg.Wait()
	}()
	for deadline := time.Now().Add(10 * time.Second); hits.Load() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the two requests never reached the upstream")
		}
	}
	req, _ := http.NewRequest("GET", srv.base+"/", nil)
	req.Header.Set("X-Priority", "batch")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Drip-Priority") != "batch" {
		t.Fatalf("past the limit: %d, Drip-Priority %q; want 503, batch", resp.StatusCode, resp.Header.Get("Drip-Priority"))
	}
	_, metrics := call(t, "GET", srv.admin+"/metrics", "")
	for _, want := range []string{`drip_adaptive_limit{rule="up"} 2`, `drip_adaptive_in_flight{rule="up"} 2`,
		`drip_shed_total{class="batch",rule="up"} 1`, `drip_shed_total{class="critical",rule="up"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if code, body := call(t, "GET", srv.admin+"/v1/admin/rules", "", "Authorization", "Bearer "+token); code != 200 || !strings.Contains(body, `"in_flight":2`) || !strings.Contains(body, `"priority_from":"header:x-priority"`) {
		t.Errorf("rules listing: %d %s", code, body)
	}
	api := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	if code, body := post(t, api.base+"/v1/take", `{"rule": "up"}`); code != 400 || !strings.Contains(body, "adaptive") {
		t.Errorf("decision API take by the adaptive rule: %d %s, want 400", code, body)
	}
}

// TestShedClassesBounded: a client names its class with any number from
// 0 to 100; drip_shed_total counts each in its named band
// (rules.PriorityBand), so a prioritized rule has at most four series
// whatever its clients send.
func TestShedClassesBounded(t *testing.T) {
	up := newUpstream(t)
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"rules": [{"name": "p", "limit_keys": ["global"], "priority_from": "header:x-priority",
	  "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}}]}`)
	srv := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1}, memstore.New())
	if code, body := call(t, "GET", srv.base+"/", "", "X-Priority", "critical"); code != 200 {
		t.Fatalf("the first request: %d %s", code, body)
	}
	for n := range 101 {
		if code, body := call(t, "GET", srv.base+"/", "", "X-Priority", strconv.Itoa(n)); code != 429 {
			t.Fatalf("class %d past the limit: %d %s", n, code, body)
		}
	}
	_, metrics := call(t, "GET", srv.admin+"/metrics", "")
	var series []string
	for line := range strings.Lines(metrics) {
		if strings.HasPrefix(line, `drip_shed_total{`) {
			series = append(series, strings.TrimSpace(line))
		}
	}
	want := []string{ // 0-24, 25-49, 50-99, 100
		`drip_shed_total{class="batch",rule="p"} 25`,
		`drip_shed_total{class="critical",rule="p"} 1`,
		`drip_shed_total{class="default",rule="p"} 50`,
		`drip_shed_total{class="sheddable",rule="p"} 25`,
	}
	if !slices.Equal(series, want) {
		t.Errorf("drip_shed_total series:\n%s\nwant:\n%s", strings.Join(series, "\n"), strings.Join(want, "\n"))
	}
}

// TestGatewayClientGone: a client that hangs up while the upstream
// works is not an upstream failure: the gateway logs no "upstream
// failed" warning for it (one line a hang-up, at the client's will),
// and the adaptive rule it held a slot of learns nothing (its limit
// stays).
func TestGatewayClientGone(t *testing.T) {
	reached := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached <- struct{}{}
		<-r.Context().Done()
	}))
	defer up.Close()
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"rules": [{"name": "up", "limit_keys": ["global"], "algorithm": "adaptive",
	  "algorithm_config": {"initial_limit": 10, "min_limit": 1, "max_limit": 10, "window": "1ms"}}]}`)
	var logs testserver.LockedBuffer
	srv := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, memstore.New())
	for range 6 {
		ctx, hangUp := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.base+"/", nil)
		go func() {
			<-reached
			hangUp()
		}()
		if _, err := http.DefaultClient.Do(req); err == nil {
			t.Fatal("a request whose client hung up was answered")
		}
		waitFor(t, "the gateway to let the request go", func() bool {
			st := srv.eng.Adaptive()
			return len(st) == 1 && st[0].InFlight == 0
		})
	}
	if st := srv.eng.Adaptive(); st[0].Limit != 10 {
		t.Errorf("after 6 clients hung up: limit %v, want 10 as it was", st[0].Limit)
	}
	if strings.Contains(logs.String(), "upstream failed") {
		t.Errorf("a client that hung up was logged as the upstream failing:\n%s", logs.String())
	}
}
