package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/driplimit/drip/store/memstore"
)

// queueRules: "q" refills 2 tokens a second into a bucket of 1, and its
// requests wait up to 1.2 s; "plain" is the same without max_wait.
const queueRules = `{"rules": [
  {"name": "q", "limit_keys": ["header:x-api-key"], "max_wait": "1.2s", "max_queue": 10,
   "algorithm_config": {"rps": 2, "burst": 1}},
  {"name": "plain", "limit_keys": ["header:x-api-key"], "match": {"header:x-plain": "yes"},
   "algorithm_config": {"rps": 2, "burst": 1}}
]}`

// statuses runs n requests at once and counts their statuses.
func statuses(n int, do func() int) map[int]int {
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			code := do()
			mu.Lock()
			got[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return got
}

// TestGatewayQueue: of 5 requests at once through the gateway on a rule
// of 2 a second with a bucket of 1 and max_wait 1.2 s, the one the
// bucket holds and the 2 it refills within 1.2 s pass (at 0, 0.5 and
// 1 s), the other 2 are answered 429 (the refill in the few ms between
// them cannot make a third token within the wait). The queue's metrics
// count them, and the rules listing shows max_wait.
func TestGatewayQueue(t *testing.T) {
	up := newUpstream(t)
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, queueRules)
	srv := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1, AdminToken: "T"}, memstore.New())
	got := statuses(5, func() int {
		resp, _ := gwGet(t, srv.base, "/x", "k")
		return resp.StatusCode
	})
	if got[200] != 3 || got[429] != 2 {
		t.Errorf("statuses %v, want 3 × 200 and 2 × 429", got)
	}
	m := scrape(t, srv.admin)
	if m[`drip_queue_wait_seconds{result=allowed,rule=q}`] != 2 || m[`drip_queue_length{rule=q}`] != 0 {
		t.Errorf("queue metrics: %v waits allowed, %v waiting; want 2 and 0", m[`drip_queue_wait_seconds{result=allowed,rule=q}`], m[`drip_queue_length{rule=q}`])
	}
	if _, ok := m[`drip_queue_length{rule=plain}`]; ok {
		t.Error("a rule without max_wait has a queue series")
	}
	code, out := call(t, "GET", srv.admin+"/v1/admin/rules", "", "Authorization", "Bearer T")
	if code != 200 || !strings.Contains(out, `"max_wait":"1.2s","max_queue":10`) {
		t.Errorf("rules listing: %d %s; want max_wait 1.2s and max_queue 10", code, out)
	}
}

// TestGatewayQueueLeave: a client that goes away while it waits leaves
// the queue at once, and its reservation is given back to the bucket.
func TestGatewayQueueLeave(t *testing.T) {
	up := newUpstream(t)
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"rules": [{"name": "q", "limit_keys": ["header:x-api-key"], "max_wait": "30s",
	  "algorithm_config": {"rate": 1, "period": "10s", "burst": 1}}]}`)
	srv := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1, AdminToken: "T"}, memstore.New())
	if resp, _ := gwGet(t, srv.base, "/x", "k"); resp.StatusCode != 200 {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.base+"/x", nil)
		req.Header.Set("X-Api-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	waitFor(t, "the second request waits", func() bool { return scrape(t, srv.admin)[`drip_queue_length{rule=q}`] == 1 })
	cancel()
	<-done
	waitFor(t, "the request that went away leaves the queue", func() bool {
		m := scrape(t, srv.admin)
		return m[`drip_queue_length{rule=q}`] == 0 && m[`drip_queue_wait_seconds{result=denied,rule=q}`] == 1
	})
	// The bucket holds what it refilled since the first request and no
	// debt: the reservation came back.
	code, out := call(t, "GET", srv.admin+"/v1/admin/bucket?rule=q&value=k", "", "Authorization", "Bearer T")
	var in inspection
	if err := json.Unmarshal([]byte(out), &in); code != 200 || err != nil || in.Decision.Tokens < 0 {
		t.Errorf("the bucket after the waiter left: %d %s; want no debt", code, out)
	}
}

// waitFor polls ok until it holds, for at most 30 s.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 30 s: %s", what)
		}
	}
}

// TestAPIWait: a decision API take asks to wait with "wait": bounded by
// the rule's max_wait and the server's MaxWait; a rule without max_wait
// waits as the body asks. "wait" on an endpoint that does not take, or
// beside "reserve", or negative, is a 400.
func TestAPIWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, queueRules)
	srv := start(t, Config{Rules: path, WatchEvery: -1, MaxWait: 5 * time.Second}, memstore.New())
	// take answers 200 when the take was allowed, 429 when it was denied.
	take := func(body string) func() int {
		return func() int {
			code, out := post(t, srv.base+"/v1/take", body)
			if code == 200 && !decision(t, out).Allowed {
				code = 429
			}
			return code
		}
	}
	// "plain" has no max_wait: the body's 1.2 s holds.
	if got := statuses(5, take(`{"rule": "plain", "values": {"header:x-api-key": "a"}, "wait": "1.2s"}`)); got[200] != 3 || got[429] != 2 {
		t.Errorf("plain with wait 1.2s: %v, want 3 × 200 and 2 × 429", got)
	}
	// "q" bounds a wait of 10 s to its 1.2 s.
	if got := statuses(5, take(`{"rule": "q", "values": {"header:x-api-key": "b"}, "wait": "10s"}`)); got[200] != 3 || got[429] != 2 {
		t.Errorf("q with wait 10s: %v, want 3 × 200 and 2 × 429", got)
	}
	// Without "wait" the API answers at once, as before.
	if got := statuses(3, take(`{"rule": "q", "values": {"header:x-api-key": "c"}}`)); got[200] != 1 || got[429] != 2 {
		t.Errorf("q without wait: %v, want 1 × 200 and 2 × 429", got)
	}
	for _, c := range []struct{ path, body, want string }{
		{"/v1/peek", `{"rule": "q", "values": {"header:x-api-key": "d"}, "wait": "1s"}`, "does not wait"},
		{"/v1/reset", `{"rule": "q", "values": {"header:x-api-key": "d"}, "wait": "1s"}`, "does not wait"},
		{"/v1/take", `{"key": "d", "limit": {"rate": 1, "period": "1s", "max_reserved": 5}, "reserve": true, "wait": "1s"}`, "do not go together"},
		{"/v1/take", `{"rule": "q", "values": {"header:x-api-key": "d"}, "wait": "-1s"}`, "wait"},
		{"/v1/take", `{"rule": "q", "values": {"header:x-api-key": "d"}, "wait": "soon"}`, "wait"},
	} {
		if code, out := post(t, srv.base+c.path, c.body); code != 400 || !strings.Contains(out, c.want) {
			t.Errorf("%s %s: %d %s, want 400 saying %q", c.path, c.body, code, out, c.want)
		}
	}
}

// TestAPIMaxWait: the server's MaxWait bounds a take's "wait".
func TestAPIMaxWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, queueRules)
	srv := start(t, Config{Rules: path, WatchEvery: -1, MaxWait: 100 * time.Millisecond}, memstore.New())
	body := `{"rule": "plain", "values": {"header:x-api-key": "a"}, "wait": "10s"}`
	if code, out := post(t, srv.base+"/v1/take", body); code != 200 || !decision(t, out).Allowed {
		t.Fatalf("first take: %d %s", code, out)
	}
	// Its 100 ms refill 0.2 of a token: the second cannot wait its turn.
	if code, out := post(t, srv.base+"/v1/take", body); code != 200 || decision(t, out).Allowed {
		t.Errorf("a take asking 10 s of a server that allows 100 ms: %d %s, want denied", code, out)
	}
}

// TestAPIAcquireWait: an acquire that asks to wait gets the slot when
// another caller releases it through the API, with a lease of its own.
func TestAPIAcquireWait(t *testing.T) {
	srv := start(t, Config{WatchEvery: -1, MaxWait: 30 * time.Second, AdminToken: "T"}, memstore.New())
	inline := `"key": "job", "limit": {"algorithm": "concurrency", "max_in_flight": 1, "lease_ttl": "10m"}`
	var a struct {
		Allowed bool   `json:"allowed"`
		Lease   string `json:"lease"`
	}
	code, out := post(t, srv.base+"/v1/acquire", `{`+inline+`}`)
	if err := json.Unmarshal([]byte(out), &a); code != 200 || err != nil || !a.Allowed {
		t.Fatalf("first acquire: %d %s", code, out)
	}
	got := make(chan string, 1)
	go func() {
		_, out := post(t, srv.base+"/v1/acquire", `{`+inline+`, "wait": "30s"}`)
		got <- out
	}()
	waitFor(t, "the second acquire waits", func() bool { return scrape(t, srv.admin)[`drip_queue_length{rule=inline}`] == 1 })
	if code, out := post(t, srv.base+"/v1/release", `{`+inline+`, "lease": "`+a.Lease+`"}`); code != 200 {
		t.Fatalf("release: %d %s", code, out)
	}
	out = <-got
	var b struct {
		Allowed bool   `json:"allowed"`
		Lease   string `json:"lease"`
	}
	if err := json.Unmarshal([]byte(out), &b); err != nil || !b.Allowed || b.Lease == "" || b.Lease == a.Lease {
		t.Errorf("the waiting acquire: %s, want allowed with a lease of its own", out)
	}
}

// TestForwardAuthQueue: forward auth waits as the gateway does: of 5
// asks at once on the rule of 2 a second, a bucket of 1 and max_wait
// 1.2 s, 3 are answered 200 and 2 are answered 429.
func TestForwardAuthQueue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, strings.Replace(queueRules, `{"rules"`, `{"trusted_proxies": ["127.0.0.1/32"], "rules"`, 1))
	fa := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	got := statuses(5, func() int {
		resp, _ := ask(t, fa.base, "", "GET", "/x", "X-Api-Key", "k")
		return resp.StatusCode
	})
	if got[200] != 3 || got[429] != 2 {
		t.Errorf("statuses %v, want 3 × 200 and 2 × 429", got)
	}
}

// holdingUpstream answers /hold only once release is closed (entered
// is sent when it starts to), and the rest at once.
func holdingUpstream(t *testing.T) (url string, entered, release chan struct{}) {
	entered, release = make(chan struct{}, 1), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			entered <- struct{}{}
			<-release
		}
		io.WriteString(w, "upstream")
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	return up.URL, entered, release
}

// slotRules: one slot for all traffic; a request waits up to 30 s for it.
const slotRules = `{"rules": [{"name": "slot", "limit_keys": ["global"], "algorithm": "concurrency",
  "max_wait": "30s", "algorithm_config": {"max_in_flight": 1}}]}`

// TestShutdownWaitsForQueue: a request waiting in a rule's queue when
// the server shuts down is not dropped when the shutdown timeout (here
// 50 ms) runs out: Serve waits for it until its wait ends (30 s), and
// it is served when the slot it waits for is released.
func TestShutdownWaitsForQueue(t *testing.T) {
	upURL, entered, release := holdingUpstream(t)
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, slotRules)
	srv := start(t, Config{Rules: path, Upstream: upURL, WatchEvery: -1, ShutdownTimeout: 50 * time.Millisecond}, memstore.New())
	held, waiter := make(chan int, 1), make(chan int, 1)
	get := func(path string, to chan int) {
		resp, err := http.Get(srv.base + path)
		if err != nil {
			to <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		to <- resp.StatusCode
	}
	go get("/hold", held)
	<-entered // the first request holds the slot
	go get("/x", waiter)
	waitFor(t, "the second request waits", func() bool { return scrape(t, srv.admin)[`drip_queue_length{rule=slot}`] == 1 })
	stopped := make(chan error, 1)
	go func() { stopped <- srv.stop() }()
	select {
	case err := <-stopped:
		t.Fatalf("Serve returned (%v) with a request waiting in the queue", err)
	case <-time.After(time.Second): // 20 times the shutdown timeout
	}
	close(release)
	if code := <-held; code != 200 {
		t.Errorf("the request that held the slot: %d", code)
	}
	if code := <-waiter; code != 200 {
		t.Errorf("the request that waited through the shutdown: %d, want 200", code)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// TestGatewayQueueLeaveSlot: a client that goes away while it waits for
// a concurrency rule's slot leaves the queue at once, long before its
// 30 s wait ends, and takes nothing: the slot, once released, serves the
// next request.
func TestGatewayQueueLeaveSlot(t *testing.T) {
	upURL, entered, release := holdingUpstream(t)
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, slotRules)
	srv := start(t, Config{Rules: path, Upstream: upURL, WatchEvery: -1}, memstore.New())
	held := make(chan int, 1)
	go func() {
		resp, err := http.Get(srv.base + "/hold")
		if err != nil {
			held <- 0
			return
		}
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	<-entered // the first request holds the slot
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.base+"/x", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	waitFor(t, "the second request waits", func() bool { return scrape(t, srv.admin)[`drip_queue_length{rule=slot}`] == 1 })
	cancel()
	<-done
	waitFor(t, "the request that went away leaves the queue", func() bool {
		m := scrape(t, srv.admin)
		return m[`drip_queue_length{rule=slot}`] == 0 && m[`drip_queue_wait_seconds{result=denied,rule=slot}`] == 1
	})
	close(release)
	if code := <-held; code != 200 {
		t.Fatalf("the request that held the slot: %d", code)
	}
	if resp, _ := gwGet(t, srv.base, "/x", ""); resp.StatusCode != 200 {
		t.Errorf("the next request once the slot was released: %d, want 200", resp.StatusCode)
	}
}
