package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/store/memstore"
)

// TestDecisionAPIAcquireRelease: /v1/acquire takes a slot under a lease
// ID the server makes and returns; /v1/release gives it back; inline and
// by rule, single and in a multi-take with a token bucket.
func TestDecisionAPIAcquireRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"rules": [
	  {"name": "jobs", "limit_keys": ["header:x-tenant"], "algorithm": "concurrency",
	   "algorithm_config": {"max_in_flight": 1, "lease_ttl": "10m"}}
	]}`)
	srv := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New(memstore.WithClock(testclock.New().Now)))
	type answer struct {
		Allowed    bool    `json:"allowed"`
		Remaining  int64   `json:"remaining"`
		Limit      float64 `json:"limit"`
		RetryAfter float64 `json:"retry_after"`
		Lease      string  `json:"lease"`
	}
	do := func(op, body string, want int) answer {
		t.Helper()
		code, out := post(t, srv.base+"/v1/"+op, body)
		if code != want {
			t.Fatalf("%s %s: %d %s, want %d", op, body, code, out, want)
		}
		var a answer
		if code == 200 {
			if err := json.Unmarshal([]byte(out), &a); err != nil {
				t.Fatal(err)
			}
		}
		return a
	}
	inline := `"key": "job", "limit": {"algorithm": "concurrency", "max_in_flight": 2, "lease_ttl": "10m"}`
	a := do("acquire", `{`+inline+`}`, 200)
	if !a.Allowed || a.Remaining != 1 || a.Limit != 2 || len(a.Lease) != 22 {
		t.Fatalf("first acquire: %+v", a)
	}
	b := do("acquire", `{`+inline+`}`, 200)
	if c := do("acquire", `{`+inline+`}`, 200); c.Allowed || c.Lease != "" || c.RetryAfter != 600 {
		t.Fatalf("third acquire: %+v, want denied, no lease, retry after 600 s", c)
	}
	if r := do("release", `{`+inline+`, "lease": "`+a.Lease+`"}`, 200); !r.Allowed || r.Remaining != 1 {
		t.Fatalf("release: %+v", r)
	}
	if r := do("release", `{`+inline+`, "lease": "`+a.Lease+`"}`, 200); !r.Allowed || r.Remaining != 1 {
		t.Fatalf("second release of one lease: %+v, want a no-op", r)
	}
	do("acquire", `{`+inline+`, "lease": "mine"}`, 400) // the server names leases
	do("take", `{`+inline+`}`, 400)                     // a take needs a lease
	do("release", `{`+inline+`}`, 400)                  // so does a release
	do("release", `{`+inline+`, "lease": "`+b.Lease+`"}`, 200)

	// By rule, and in a multi-take beside a token bucket: all or nothing.
	tb := `{"key": "tb", "limit": {"rate": 1, "period": "1h", "burst": 1}}`
	multi := `{"requests": [{"rule": "jobs", "values": ["t1"]}, ` + tb + `]}`
	code, out := post(t, srv.base+"/v1/acquire", multi)
	var m struct {
		Allowed bool     `json:"allowed"`
		Results []answer `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &m); code != 200 || err != nil || !m.Allowed || len(m.Results[0].Lease) != 22 || m.Results[1].Lease != "" {
		t.Fatalf("multi acquire: %d %s", code, out)
	}
	lease := m.Results[0].Lease
	// The bucket is empty now: a second multi-take is denied and takes
	// no slot (the one slot is held, so release it first to see that).
	do("release", `{"rule": "jobs", "values": ["t1"], "lease": "`+lease+`"}`, 200)
	code, out = post(t, srv.base+"/v1/acquire", multi)
	m.Results = nil
	if err := json.Unmarshal([]byte(out), &m); code != 200 || err != nil || m.Allowed || m.Results[0].Lease != "" {
		t.Fatalf("multi acquire on an empty bucket: %d %s", code, out)
	}
	if p := do("peek", `{"rule": "jobs", "values": ["t1"]}`, 200); !p.Allowed || p.Remaining != 1 {
		t.Fatalf("after a denied multi-take: %+v, want the slot free", p)
	}
}

// TestGatewayReleasesSlot: the gateway holds a concurrency rule's slot
// until the proxied response has ended, and then gives it back.
func TestGatewayReleasesSlot(t *testing.T) {
	up, started, finish := slowUpstream(t)
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"rules": [
	  {"name": "one", "limit_keys": ["global"], "algorithm": "concurrency",
	   "algorithm_config": {"max_in_flight": 1, "lease_ttl": "1h"}}
	]}`)
	srv := start(t, Config{Rules: path, Upstream: up.URL, WatchEvery: -1}, memstore.New())
	done := make(chan string)
	go func() {
		resp, err := http.Get(srv.base + "/slow")
		if err != nil {
			done <- err.Error()
			return
		}
		resp.Body.Close()
		done <- resp.Status
	}()
	<-started
	resp, body := gwGet(t, srv.base, "/fast", "")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "concurrency_exceeded") {
		t.Fatalf("while the slow response is proxied: %d %s, want 429", resp.StatusCode, body)
	}
	if ra := resp.Header.Get("Retry-After"); ra == "" {
		t.Errorf("no Retry-After on a concurrency denial")
	}
	close(finish)
	if s := <-done; !strings.HasPrefix(s, "200") {
		t.Fatalf("the slow request: %s", s)
	}
	if resp, body := gwGet(t, srv.base, "/fast", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the slow response ended: %d %s, want 200", resp.StatusCode, body)
	}
}

// TestStoresRelease: on every store, /v1/release gives back slots only:
// a release that repeats the acquire's token buckets gives back none of
// their tokens; and a denied multi-acquire leaves no slot taken (on Redis
// Cluster its keys lie in different hash slots, taken one by one).
func TestStoresRelease(t *testing.T) {
	for _, st := range teststores.Shared() {
		t.Run(st.Name, func(t *testing.T) {
			srv := start(t, Config{}, st.Open(t))
			type answer struct {
				Allowed   bool   `json:"allowed"`
				Remaining int64  `json:"remaining"`
				Lease     string `json:"lease"`
			}
			var m struct {
				Allowed bool     `json:"allowed"`
				Results []answer `json:"results"`
			}
			do := func(op, body string) {
				t.Helper()
				code, out := post(t, srv.base+"/v1/"+op, body)
				m.Allowed, m.Results = false, nil
				if err := json.Unmarshal([]byte(out), &m); code != 200 || err != nil {
					t.Fatalf("%s %s: %d %s", op, body, code, out)
				}
			}
			// On the store's clock: remaining, not tokens (1 per hour
			// drips in meanwhile).
			remaining := func(body string) int64 {
				t.Helper()
				code, out := post(t, srv.base+"/v1/peek", body)
				if code != 200 {
					t.Fatalf("peek %s: %d %s", body, code, out)
				}
				return int64(decision(t, out).Remaining)
			}
			job := `"key": "job", "limit": {"algorithm": "concurrency", "max_in_flight": 1, "lease_ttl": "10m"}`
			tb := `"key": "tb", "limit": {"rate": 1, "period": "1h", "burst": 4}`
			do("acquire", `{"requests": [{`+job+`}, {`+tb+`, "cost": 1}]}`)
			if !m.Allowed || m.Results[0].Lease == "" {
				t.Fatalf("acquire: %+v", m)
			}
			lease := m.Results[0].Lease
			do("release", `{"requests": [{`+job+`, "lease": "`+lease+`"}, {`+tb+`, "cost": 1}]}`)
			if !m.Allowed || m.Results[0].Remaining != 1 || m.Results[1].Remaining != 3 {
				t.Errorf("release of the lease and the bucket: %+v, want the slot free and 3 tokens", m)
			}
			if _, out := post(t, srv.base+"/v1/release", `{`+tb+`, "cost": 1}`); decision(t, out).Remaining != 3 {
				t.Errorf("a release of the bucket alone: %s, want 3 tokens", out)
			}
			if got := remaining(`{` + tb + `, "cost": 0}`); got != 3 {
				t.Errorf("after the releases the bucket holds %d, want 3: a release gives back slots only", got)
			}
			if got := remaining(`{` + job + `}`); got != 1 {
				t.Errorf("after the release %d slots are free, want 1", got)
			}
			// Empty the bucket: an acquire beside it is denied, and takes
			// no slot.
			do("take", `{"requests": [{`+tb+`, "cost": 3}]}`)
			do("acquire", `{"requests": [{`+job+`}, {`+tb+`, "cost": 1}]}`)
			if m.Allowed || !m.Results[0].Allowed || m.Results[0].Lease != "" {
				t.Errorf("an acquire beside an empty bucket: %+v, want denied by the bucket", m)
			}
			if got := remaining(`{` + job + `}`); got != 1 {
				t.Errorf("after a denied acquire %d slots are free, want 1", got)
			}
		})
	}
}

// slowUpstream is an upstream that holds each request to /slow until
// finish is closed (started says when one arrived), and answers others
// at once.
func slowUpstream(t *testing.T) (up *httptest.Server, started, finish chan struct{}) {
	started, finish = make(chan struct{}, 1), make(chan struct{})
	up = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			started <- struct{}{}
			<-finish
		}
		fmt.Fprint(w, "done")
	}))
	t.Cleanup(up.Close)
	return up, started, finish
}
