package server

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
