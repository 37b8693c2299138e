package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// TestUsageAboveLargestAmount: a response that reports more than the
// largest amount drip counts (1e12) charges as much as a report of 1e12,
// never less: through the gateway, in a header and in a trailer. With an
// estimate of 1 taken from a burst of 100 and a debt bound of 50, each
// report runs the bucket to the bound, -50 (less a micro-token the
// charge keeps against rounding; the rest is forgiven), as 1e12 does.
func TestUsageAboveLargestAmount(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get("X-Test-Usage")
		if r.URL.Path == "/trailer" {
			w.Header().Set("Trailer", "X-Usage")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "done")
			w.Header().Set("X-Usage", v)
			return
		}
		w.Header().Set("X-Usage", v)
		io.WriteString(w, "done")
	}))
	t.Cleanup(up.Close)
	var cfg strings.Builder
	cfg.WriteString("rules:\n")
	for _, where := range []string{"header", "trailer"} {
		fmt.Fprintf(&cfg, `  - name: %[1]s
    limit_keys: ["header:x-tenant"]
    match: {path: /%[1]s}
    cost_from_response: "%[1]s:x-usage"
    algorithm: token_bucket
    algorithm_config: {rate: 100, period: 1h, burst: 100, max_reserved: 50}
`, where)
	}
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	set, st, srv := frozenGateway(t, file, up.URL)

	n := 0.0
	for _, where := range []string{"header", "trailer"} {
		for _, usage := range []string{"1000000000000", "1000000000001", "99999999999999999999", "9223372036854775807", "123456789012345678901234567890123456789012345678901234567890"} {
			n++
			tenant := where + usage
			req, _ := http.NewRequest("GET", srv.base+"/"+where, nil)
			req.Header.Set("X-Tenant", tenant)
			req.Header.Set("X-Test-Usage", usage)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				t.Fatalf("%s %s: %d", where, usage, res.StatusCode)
			}
			key := `drip_decisions_total{mode=enforce,outcome=forgiven,rule=` + where + `}`
			for deadline := time.Now().Add(30 * time.Second); scrape(t, srv.admin)[key] < n-map[string]float64{"header": 0, "trailer": 5}[where]; {
				if time.Now().After(deadline) {
					t.Fatalf("%s of %s: never charged (%s = %v)", where, usage, key, scrape(t, srv.admin)[key])
				}
				time.Sleep(5 * time.Millisecond)
			}
			r, _ := set.Rule(where)
			m, err := drip.Apply(context.Background(), st, bucket.Peek, time.Time{}, drip.Request{Key: r.Key([]string{tenant}), Limit: r.Limit})
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Decisions[0].Tokens; got > -49.999999 || got < -50 {
				t.Errorf("a usage of %s in a %s: %v tokens left, want -50 (charged to the debt bound)", usage, where, got)
			}
		}
	}
}

// frozenGateway starts drip serve's gateway to upstream with the rules
// file on a memory store frozen at one instant, and returns the rules as
// loaded, the store and the server.
func frozenGateway(t *testing.T, file, upstream string) (*rules.Set, frozen, *running) {
	t.Helper()
	set, err := rules.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	ms := memstore.New()
	t.Cleanup(func() { ms.Close() })
	st := frozen{ms, time.Now()}
	return set, st, start(t, Config{Rules: file, Upstream: upstream, WatchEvery: -1}, st)
}
