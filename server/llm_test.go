package server

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	llm "github.com/driplimit/drip/examples/llm/upstream"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// frozen is a store whose every decision is at one instant: the buckets
// of the example refill by the second, and the test counts tokens exactly.
type frozen struct {
	store.Store
	at time.Time
}

func (f frozen) Apply(ctx context.Context, op bucket.Op, _ time.Time, items []bucket.Prepared, results []bucket.Result) error {
	return f.Store.Apply(ctx, op, f.at, items, results)
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

// TestLLMExample runs examples/llm: drip serve's gateway with its rules in
// front of the test upstream, which streams server-sent events and reports
// its usage in a trailer. Each request takes its estimate before it is
// forwarded and is settled at the end of its stream, on both of the
// tenant's buckets; a client that goes away mid-stream leaves its
// estimate; an upstream that cannot be reached takes nothing; a tenant
// over its minute is refused before reaching the upstream.
func TestLLMExample(t *testing.T) {
	up := httptest.NewServer(llm.Handler())
	t.Cleanup(up.Close)
	set, st, srv := frozenGateway(t, "../examples/llm/rules.yaml", up.URL)

	tokens := func(tenant string) (minute, day float64) {
		t.Helper()
		var got []float64
		for _, name := range []string{"tokens-minute", "tokens-day"} {
			r, _ := set.Rule(name)
			m, err := drip.Apply(context.Background(), st, bucket.Peek, time.Time{}, drip.Request{Key: r.Key([]string{tenant}), Limit: r.Limit})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, m.Decisions[0].Tokens)
		}
		return got[0], got[1]
	}
	// settled waits until the metrics count n settlements of event on
	// the minute rule (the settlement follows the response's end).
	settled := func(event string, n float64) {
		t.Helper()
		key := `drip_decisions_total{mode=enforce,outcome=` + event + `,rule=tokens-minute}`
		for deadline := time.Now().Add(30 * time.Second); scrape(t, srv.admin)[key] < n; {
			if time.Now().After(deadline) {
				t.Fatalf("%s never reached %v", key, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	chat := func(ctx context.Context, tenant string, headers ...string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.base+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
		req.Header.Set("X-Tenant", tenant)
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	// A whole stream: 1,000 estimated, 10 + 20 used: 970 back.
	res := chat(context.Background(), "acme")
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), `"total_tokens":30`) || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("%d %q", res.StatusCode, body)
	}
	if res.Trailer.Get(llm.Trailer) != "30" {
		t.Errorf("trailer %v", res.Trailer)
	}
	settled("refunded", 1)
	if m, d := tokens("acme"); m != 100000-30 || d != 2000000-30 {
		t.Errorf("after one stream of 30 tokens: %v and %v left", m, d)
	}

	// More than estimated: 500 estimated, 95,000 used: charged.
	res = chat(context.Background(), "acme", "X-Estimated-Tokens", "500", "X-Test-Completion-Tokens", "94990")
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	settled("charged", 1)
	if m, d := tokens("acme"); m != 100000-30-95000 || d != 2000000-30-95000 {
		t.Errorf("after 95,000 more: %v and %v left", m, d)
	}
	// 4,970 left this minute: an estimate of 5,000 is refused before the
	// upstream sees it; 4,000 goes through.
	res = chat(context.Background(), "acme", "X-Estimated-Tokens", "5000")
	res.Body.Close()
	if res.StatusCode != 429 || res.Header.Get("Retry-After") == "" {
		t.Errorf("over the minute: %d", res.StatusCode)
	}

	// A client that goes away mid-stream: the gateway cancels the
	// upstream request, whose trailer never comes; the estimate stands.
	ctx, cancel := context.WithCancel(context.Background())
	res = chat(ctx, "beta", "X-Estimated-Tokens", "700", "X-Test-Completion-Tokens", "100000")
	if line, err := bufio.NewReader(res.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("%q %v", line, err)
	}
	cancel()
	res.Body.Close()
	settled("settled", 1)
	if m, d := tokens("beta"); m != 100000-700 || d != 2000000-700 {
		t.Errorf("client gone: %v and %v left, want the estimate of 700 taken", m, d)
	}

	// An upstream that cannot be reached: 502, and nothing taken.
	up.Close()
	res = chat(context.Background(), "gamma")
	res.Body.Close()
	if res.StatusCode != 502 {
		t.Fatalf("upstream down: %d", res.StatusCode)
	}
	settled("refunded", 2)
	if m, d := tokens("gamma"); m != 100000 || d != 2000000 {
		t.Errorf("upstream down: %v and %v left, want nothing taken", m, d)
	}
	// The tokens each settlement moved: 970 and 1,000 refunded, 94,500
	// charged, none forgiven.
	got := scrape(t, srv.admin)
	for outcome, want := range map[string]float64{"refunded": 1970, "charged": 94500, "forgiven": 0} {
		for _, rule := range []string{"tokens-minute", "tokens-day"} {
			if k := "drip_settled_tokens_total{outcome=" + outcome + ",rule=" + rule + "}"; got[k] != want {
				t.Errorf("%s: %v, want %v", k, got[k], want)
			}
		}
	}
}

// TestForwardAuthSettles: forward auth hears nothing after the request, as
// docs/api.md says: a cost_from_response rule keeps its estimate, and a
// count_status rule is only checked (its bucket stays full).
func TestForwardAuthSettles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"trusted_proxies": ["127.0.0.1/32"], "rules": [
	  {"name": "tokens", "limit_keys": ["header:x-tenant"], "cost_from_response": "header:x-usage",
	   "algorithm_config": {"rate": 1000, "period": "1h", "cost_source": "header:x-estimate", "default_cost": 100}},
	  {"name": "logins", "limit_keys": ["header:x-user"], "count_status": [401],
	   "algorithm_config": {"rate": 2, "period": "1h"}}]}`)
	srv := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	for i := range 3 {
		resp, _ := ask(t, srv.base, "", "GET", "/v1/chat", "X-Tenant", "a", "X-Estimate", "300")
		if want := strconv.Itoa(1000 - 300*(i+1)); resp.StatusCode != 200 || resp.Header.Get("RateLimit-Remaining") != want {
			t.Fatalf("ask %d: %d, %q left, want %s", i, resp.StatusCode, resp.Header.Get("RateLimit-Remaining"), want)
		}
	}
	for i := range 5 {
		resp, _ := ask(t, srv.base, "", "POST", "/login", "X-User", "u")
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Remaining") != "1" {
			t.Fatalf("login ask %d: %d, remaining %q: a check takes nothing", i, resp.StatusCode, resp.Header.Get("RateLimit-Remaining"))
		}
	}
}
