package httplimit_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// settleObserver hands over each settlement event (charged, refunded,
// forgiven, settled, unreported) as "rule/event", so that a test waits for the
// settlement that follows a response instead of sleeping.
type settleObserver struct {
	engine.NopObserver
	events chan string
	mu     sync.Mutex
	tokens map[string]float64 // "rule/event": tokens (engine.TokenObserver)
}

func (o *settleObserver) Tokens(rule string, ev engine.Event, tokens float64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.tokens == nil {
		o.tokens = map[string]float64{}
	}
	o.tokens[rule+"/"+string(ev)] += tokens
}

func (o *settleObserver) moved(key string) float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.tokens[key]
}

func (o *settleObserver) Decision(rule string, _ rules.Mode, ev engine.Event) {
	switch ev {
	case engine.Charged, engine.Refunded, engine.Forgiven, engine.Settled, engine.Unreported:
		o.events <- rule + "/" + string(ev)
	}
}

func (o *settleObserver) next(t *testing.T) string {
	t.Helper()
	select {
	case ev := <-o.events:
		return ev
	case <-time.After(teststores.Timeout):
		t.Fatal("no settlement")
		return ""
	}
}

// settleEnv is a limiter in front of handler, on st (memory when nil), at
// a frozen injected time.
type settleEnv struct {
	srv   *httptest.Server
	lim   *httplimit.Limiter
	obs   *settleObserver
	clock *testclock.Clock
	set   *rules.Set
}

func newSettleEnv(t *testing.T, st store.Store, src string, handler http.Handler) *settleEnv {
	t.Helper()
	if st == nil {
		ms := memstore.New()
		t.Cleanup(func() { ms.Close() })
		st = ms
	}
	e := &settleEnv{obs: &settleObserver{events: make(chan string, 1024)}, clock: testclock.New(), set: parse(t, src)}
	e.clock.Set(time.Now())
	e.lim = httplimit.New(st, e.set, engine.WithTimeout(teststores.Timeout), engine.WithClock(e.clock.Now), engine.WithObserver(e.obs))
	t.Cleanup(func() { e.lim.Close() })
	e.srv = httptest.NewUnstartedServer(e.lim.Handler(handler))
	e.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // TestSettlePanic's panic
	e.srv.Start()
	t.Cleanup(e.srv.Close)
	return e
}

// tokens peeks at rule's bucket for key value v.
func (e *settleEnv) tokens(t *testing.T, rule, v string) float64 {
	t.Helper()
	r, _ := e.set.Rule(rule)
	m, err := drip.Apply(context.Background(), e.lim.Store(), bucket.Peek, e.clock.Now(), drip.Request{Key: r.Key([]string{v}), Limit: r.Limit})
	if err != nil {
		t.Fatal(err)
	}
	return m.Decisions[0].Tokens
}

func (e *settleEnv) get(t *testing.T, path string, headers ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", e.srv.URL+path, nil)
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

const usageRules = `{"rules": [
	{"name": "tokens", "limit_keys": ["header:x-tenant"], "cost_from_response": "header:x-usage",
	 "algorithm": "token_bucket",
	 "algorithm_config": {"rate": 1000, "period": "1h", "burst": 1000,
	                      "cost_source": "header:x-estimate", "default_cost": 100}}]}`

// usageHandler answers with the usage its query asks for (?usage=N), in
// the X-Usage header; ?fail=1 answers 502 without being served.
func usageHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("fail") != "" {
			httplimit.Errored(w)
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		if u := r.URL.Query().Get("usage"); u != "" {
			w.Header().Set("X-Usage", u)
		}
		if r.URL.Query().Get("silent") != "" {
			return // no body: an implicit 200
		}
		fmt.Fprintln(w, "done")
	})
}

func TestCostFromResponseHeader(t *testing.T) {
	e := newSettleEnv(t, nil, usageRules, usageHandler())
	steps := []struct {
		query, estimate string
		event           string
		want            float64 // tokens after the settlement
	}{
		{"?usage=250", "", "tokens/charged", 750},          // took 100, then 150 more
		{"?usage=20", "", "tokens/refunded", 730},          // took 100, 80 back
		{"?usage=40", "40", "tokens/settled", 690},         // as estimated
		{"", "50", "tokens/unreported", 640},               // no usage: the estimate stands
		{"?usage=x", "10", "tokens/unreported", 630},       // not a cost: the estimate stands
		{"?fail=1", "300", "tokens/refunded", 630},         // errored: took nothing
		{"?usage=0", "", "tokens/refunded", 630},           // a usage of 0 costs nothing
		{"?usage=30&silent=1", "", "tokens/refunded", 600}, // no body: still served (200)
		{"?usage=1500", "", "tokens/charged", -900},        // 600 - 1500: into debt, the work is done
	}
	for _, s := range steps {
		var hs []string
		if s.estimate != "" {
			hs = append(hs, "X-Estimate: "+s.estimate)
		}
		code, _ := e.get(t, "/"+s.query, append(hs, "X-Tenant: a")...)
		if want := 200; s.query == "?fail=1" {
			want = 502
			if code != want {
				t.Fatalf("%s: %d", s.query, code)
			}
		} else if code != want {
			t.Fatalf("%s: %d", s.query, code)
		}
		if ev := e.obs.next(t); ev != s.event {
			t.Errorf("%s: %s, want %s", s.query, ev, s.event)
		}
		if got := e.tokens(t, "tokens", "a"); got != s.want {
			t.Errorf("%s (estimate %q): %v tokens, want %v", s.query, s.estimate, got, s.want)
		}
	}
	// In debt, the next request is denied until the debt is paid back.
	if code, _ := e.get(t, "/?usage=1", "X-Tenant: a"); code != 429 {
		t.Errorf("in debt: %d, want 429", code)
	}
	// An hour refills 1000: 100, and one more request goes through.
	e.clock.Add(time.Hour)
	if code, _ := e.get(t, "/?usage=1", "X-Tenant: a", "X-Estimate: 1"); code != 200 {
		t.Errorf("after an hour: %d", code)
	}
}

func TestCostFromResponseDebtBound(t *testing.T) {
	// The debt is bounded by max_reserved (here 200); without it, by one
	// burst. A charge past the bound is cut to what the bound leaves.
	for _, c := range []struct {
		maxReserved string
		want        float64
	}{{`, "max_reserved": 200`, -200}, {"", -1000}} {
		src := strings.Replace(usageRules, `"default_cost": 100`, `"default_cost": 100`+c.maxReserved, 1)
		e := newSettleEnv(t, nil, src, usageHandler())
		e.get(t, "/?usage=5000", "X-Tenant: b")
		if ev := e.obs.next(t); ev != "tokens/forgiven" {
			t.Errorf("%q: %s, want forgiven", c.maxReserved, ev)
		}
		if got := e.tokens(t, "tokens", "b"); got < c.want || got > c.want+0.001 {
			t.Errorf("%q: %v tokens, want %v", c.maxReserved, got, c.want)
		}
		// 900 left after the estimate: charged down to the bound, the
		// rest of the 4,900 forgiven.
		charged, forgiven := e.obs.moved("tokens/charged"), e.obs.moved("tokens/forgiven")
		if math.Abs(charged-(900-c.want)) > 0.001 || math.Abs(charged+forgiven-4900) > 1e-6 {
			t.Errorf("%q: %v charged and %v forgiven, want %v and the rest of 4900", c.maxReserved, charged, forgiven, 900-c.want)
		}
	}
}

// TestCostFromTrailerStreamed: a streamed response reports its usage in a
// trailer after its body, and settles at its end, also when the client
// went away before the end (the handler then reports what it used).
func TestCostFromTrailerStreamed(t *testing.T) {
	src := strings.Replace(usageRules, `"header:x-usage"`, `"trailer:x-usage"`, 1)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Usage")
		w.Header().Set("Content-Type", "text/event-stream")
		n := 0
		for i := range 5 {
			fmt.Fprintf(w, "data: chunk %d\n\n", i)
			_ = http.NewResponseController(w).Flush()
			n += 10
			if r.URL.Query().Get("gone") != "" {
				<-r.Context().Done() // the client went away
				break
			}
		}
		w.Header().Set("X-Usage", fmt.Sprint(n))
	})
	e := newSettleEnv(t, nil, src, handler)

	req, _ := http.NewRequest("GET", e.srv.URL+"/", nil)
	req.Header.Set("X-Tenant", "c")
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.Trailer.Get("X-Usage") != "50" || strings.Count(string(b), "data:") != 5 {
		t.Fatalf("trailer %v, body %q", res.Trailer, b)
	}
	if ev := e.obs.next(t); ev != "tokens/refunded" {
		t.Errorf("whole stream: %s", ev)
	}
	if got := e.tokens(t, "tokens", "c"); got != 950 {
		t.Errorf("whole stream: %v tokens, want 950 (1000 - 50)", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ = http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/?gone=1", nil)
	req.Header.Set("X-Tenant", "d")
	res, err = e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || line != "data: chunk 0\n" {
		t.Fatalf("%q %v", line, err)
	}
	cancel() // the client goes away mid-stream
	res.Body.Close()
	if ev := e.obs.next(t); ev != "tokens/refunded" {
		t.Errorf("client gone: %s", ev)
	}
	if got := e.tokens(t, "tokens", "d"); got != 990 {
		t.Errorf("client gone: %v tokens, want 990 (1000 - 10 used)", got)
	}
}

const loginRules = `{"rules": [
	{"name": "logins", "limit_keys": ["header:x-user"], "count_status": [401, 403],
	 "algorithm": "token_bucket", "algorithm_config": {"rate": 5, "period": "1h", "burst": 5}}]}`

// loginHandler fails logins (401) unless the password is right.
func loginHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Password") != "right" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		fmt.Fprintln(w, "welcome")
	})
}

func TestCountStatus(t *testing.T) {
	e := newSettleEnv(t, nil, loginRules, loginHandler())
	// Successful logins are checked, never counted.
	for range 10 {
		if code, _ := e.get(t, "/", "X-User: u", "X-Password: right"); code != 200 {
			t.Fatalf("good login: %d", code)
		}
		if ev := e.obs.next(t); ev != "logins/settled" {
			t.Fatalf("good login: %s", ev)
		}
	}
	// Five failures are counted; the sixth attempt is refused before it
	// reaches the handler, right password or not.
	for i := range 5 {
		if code, _ := e.get(t, "/", "X-User: u"); code != 401 {
			t.Fatalf("failure %d: %d", i, code)
		}
		if ev := e.obs.next(t); ev != "logins/charged" {
			t.Fatalf("failure %d: %s", i, ev)
		}
	}
	if code, _ := e.get(t, "/", "X-User: u", "X-Password: right"); code != 429 {
		t.Fatalf("after 5 failures: %d", code)
	}
	if got := e.tokens(t, "logins", "u"); got != 0 {
		t.Errorf("%v tokens, want 0", got)
	}
	// Another user is not limited.
	if code, _ := e.get(t, "/", "X-User: v"); code != 401 {
		t.Errorf("other user: %d", code)
	}
}

// TestCountStatusParallel holds count_status to its stated bound on a
// real store: a check before the request cannot hold what it saw, so
// with W clients failing logins in parallel (each one request at a time)
// at most burst + W - 1 failures get through before every later attempt
// is refused, and every failure that got through is counted: the bucket
// ends at burst minus the failures (in debt for those past the burst).
func TestCountStatusParallel(t *testing.T) {
	const workers, burst = 8, 5
	for _, name := range []string{"memory", "postgres", "redis"} {
		t.Run(name, func(t *testing.T) {
			// Room in the debt for every failure past the burst, so that
			// none is forgiven and each one shows in the bucket.
			src := strings.Replace(loginRules, `"burst": 5}`, `"burst": 5, "max_reserved": 10}`, 1)
			e := newSettleEnv(t, teststores.Open(t, name), src, loginHandler())
			user := runID()
			var failed, refused atomic.Int64
			var wg sync.WaitGroup
			for range workers {
				wg.Go(func() {
					for {
						code, _ := e.get(t, "/", "X-User: "+user)
						switch code {
						case 401:
							failed.Add(1)
							if ev := e.obs.next(t); ev != "logins/charged" {
								t.Errorf("%s", ev)
							}
						case 429:
							refused.Add(1)
							return
						default:
							t.Errorf("status %d", code)
							return
						}
					}
				})
			}
			wg.Wait()
			n := failed.Load()
			if n < burst || n > burst+workers-1 {
				t.Errorf("%d failures got through; want from %d to %d", n, burst, burst+workers-1)
			}
			if got, want := e.tokens(t, "logins", user), float64(burst-n); got != want {
				t.Errorf("%v tokens after %d failures, want %v: a failure went uncounted or twice", got, n, want)
			}
			t.Logf("%d workers, burst %d: %d failures got through, %d refused", workers, burst, n, refused.Load())
		})
	}
}

// TestCountStatusAllOrNothing: a count_status rule that refuses the
// request leaves the other rules' buckets as they were, and its check
// takes nothing from its own when the request is allowed.
func TestCountStatusAllOrNothing(t *testing.T) {
	src := `{"rules": [
	{"name": "logins", "limit_keys": ["header:x-user"], "count_status": "4xx",
	 "algorithm_config": {"rate": 2, "period": "1h"}},
	{"name": "per-user", "limit_keys": ["header:x-user"],
	 "algorithm_config": {"rate": 100, "period": "1h"}}]}`
	e := newSettleEnv(t, nil, src, loginHandler())
	for range 2 {
		if code, _ := e.get(t, "/", "X-User: u"); code != 401 {
			t.Fatalf("%d", code)
		}
		e.obs.next(t)
	}
	if got := e.tokens(t, "per-user", "u"); got != 98 {
		t.Fatalf("per-user: %v, want 98", got)
	}
	for range 3 {
		if code, _ := e.get(t, "/", "X-User: u", "X-Password: right"); code != 429 {
			t.Fatalf("locked out: %d", code)
		}
	}
	if got := e.tokens(t, "per-user", "u"); got != 98 {
		t.Errorf("per-user after refusals: %v, want 98 (nothing taken)", got)
	}
	if got := e.tokens(t, "logins", "u"); got != 0 {
		t.Errorf("logins: %v, want 0", got)
	}
}

// TestSettlePanic: a handler that panics before it wrote anything served
// nothing: the estimate is refunded, and the panic goes on.
func TestSettlePanic(t *testing.T) {
	e := newSettleEnv(t, nil, usageRules, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("boom")
	}))
	req, _ := http.NewRequest("GET", e.srv.URL+"/", nil)
	req.Header.Set("X-Tenant", "p")
	if res, err := e.srv.Client().Do(req); err == nil {
		res.Body.Close()
		t.Fatalf("a panicking handler answered %d", res.StatusCode)
	}
	if ev := e.obs.next(t); ev != "tokens/refunded" {
		t.Errorf("%s, want refunded", ev)
	}
	if got := e.tokens(t, "tokens", "p"); got != 1000 {
		t.Errorf("%v tokens, want 1000", got)
	}
}

// TestChargeTwoRules: one response settles every rule it applied to; a
// charge that one bucket's debt bound refuses is cut to what that bound
// leaves, while the other bucket is charged in full.
func TestChargeTwoRules(t *testing.T) {
	src := `{"rules": [
	{"name": "minute", "limit_keys": ["header:x-tenant"], "cost_from_response": "header:x-usage",
	 "algorithm_config": {"rate": 100, "period": "1m", "cost_source": "header:x-estimate", "default_cost": 10}},
	{"name": "day", "limit_keys": ["header:x-tenant"], "cost_from_response": "header:x-usage",
	 "algorithm_config": {"rate": 10000, "period": "24h", "cost_source": "header:x-estimate", "default_cost": 10}}]}`
	// On every store: on Redis Cluster the two keys are in different
	// hash slots, and the charge is taken one key at a time.
	for _, st := range teststores.Shared() {
		t.Run(st.Name, func(t *testing.T) {
			e := newSettleEnv(t, st.Open(t), src, usageHandler())
			if code, _ := e.get(t, "/?usage=500", "X-Tenant: t"); code != 200 {
				t.Fatal(code)
			}
			got := map[string]bool{e.obs.next(t): true, e.obs.next(t): true}
			if !got["minute/forgiven"] || !got["day/charged"] {
				t.Errorf("events %v, want minute/forgiven and day/charged", got)
			}
			if m := e.tokens(t, "minute", "t"); m < -100 || m > -99.999 {
				t.Errorf("minute: %v, want -100 (one burst of debt)", m)
			}
			if d := e.tokens(t, "day", "t"); d != 10000-500 {
				t.Errorf("day: %v, want 9500", d)
			}
		})
	}
}

// TestCostFromResponseFixedWindow: a fixed window settles as a token
// bucket does (the same reservation and refund).
func TestCostFromResponseFixedWindow(t *testing.T) {
	src := strings.Replace(usageRules, `"algorithm": "token_bucket"`, `"algorithm": "fixed_window"`, 1)
	e := newSettleEnv(t, nil, src, usageHandler())
	for _, s := range []struct {
		query string
		want  float64
	}{{"?usage=250", 750}, {"?usage=50", 700}, {"?usage=1500", -800}} {
		if code, _ := e.get(t, "/"+s.query, "X-Tenant: w"); code != 200 {
			t.Fatalf("%s: %d", s.query, code)
		}
		e.obs.next(t)
		if got := e.tokens(t, "tokens", "w"); got != s.want {
			t.Errorf("%s: %v, want %v", s.query, got, s.want)
		}
	}
}

// TestCostFromResponseHostile: what a response reports and what a
// request estimates are read as costs only when they are plain decimal
// numbers: a sign, an exponent, hex or NaN leave the estimate (or, for
// the estimate, the rule's default cost), and so do, for the estimate,
// digits past 1e12 or 32 characters; a report above 1e12 counts as 1e12
// (a larger report never charges less), however long; an estimate above
// the burst is refused and takes nothing; of several values of the
// header, the first counts; a report of the largest cost charges at most
// to the debt bound. Each step starts on a full bucket.
func TestCostFromResponseHostile(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, u := range r.URL.Query()["usage"] {
			w.Header().Add("X-Usage", u)
		}
		fmt.Fprintln(w, "done")
	})
	e := newSettleEnv(t, nil, usageRules, h)
	want := 1000.0
	for _, s := range []struct {
		usage    []string
		estimate string
		event    string
		delta    float64 // tokens taken in the end
	}{
		{[]string{"-500"}, "", "tokens/unreported", 100},
		{[]string{"NaN"}, "", "tokens/unreported", 100},
		{[]string{"Inf"}, "", "tokens/unreported", 100},
		{[]string{"0x10"}, "", "tokens/unreported", 100},
		{[]string{"1e3"}, "", "tokens/unreported", 100},
		{[]string{"1_0"}, "", "tokens/unreported", 100},
		// 5, however long:
		{[]string{strings.Repeat("0", 40) + "5"}, "", "tokens/refunded", 5},
		{[]string{"5", "900"}, "", "tokens/refunded", 5},     // the first
		{[]string{"x", "900"}, "", "tokens/unreported", 100}, // the first is not a cost
		{[]string{"20"}, "1e12", "tokens/refunded", 20},      // the estimate: default_cost
		{[]string{"20"}, "-5", "tokens/refunded", 20},        // the estimate: default_cost
		{[]string{"20"}, "NaN", "tokens/refunded", 20},       // the estimate: default_cost
		{[]string{"20"}, "0", "tokens/charged", 20},          // an estimate of 0 is an estimate
		{[]string{"20"}, strings.Repeat("9", 33), "tokens/refunded", 20},
	} {
		e.clock.Add(time.Hour) // full again: 1000 an hour
		q := "/?"
		for _, u := range s.usage {
			q += "usage=" + strings.ReplaceAll(u, "+", "%2B") + "&"
		}
		hs := []string{"X-Tenant: h"}
		if s.estimate != "" {
			hs = append(hs, "X-Estimate: "+s.estimate)
		}
		if code, _ := e.get(t, q, hs...); code != 200 {
			t.Fatalf("%v (estimate %q): %d", s.usage, s.estimate, code)
		}
		if ev := e.obs.next(t); ev != s.event {
			t.Errorf("%v (estimate %q): %s, want %s", s.usage, s.estimate, ev, s.event)
		}
		want = 1000 - s.delta
		if got := e.tokens(t, "tokens", "h"); got != want {
			t.Fatalf("%v (estimate %q): %v tokens, want %v", s.usage, s.estimate, got, want)
		}
	}
	// An estimate above the burst is refused (429) and takes nothing.
	if code, _ := e.get(t, "/?usage=1", "X-Tenant: h", "X-Estimate: 999999999999"); code != 429 {
		t.Errorf("an estimate of 999999999999: %d, want 429", code)
	}
	if got := e.tokens(t, "tokens", "h"); got != want {
		t.Errorf("after the refused estimate: %v tokens, want %v", got, want)
	}
	// The largest cost a response may report: charged into debt down to
	// one burst, the rest forgiven.
	e.get(t, "/?usage=1000000000000", "X-Tenant: h")
	if ev := e.obs.next(t); ev != "tokens/forgiven" {
		t.Errorf("a report of 1e12: %s, want forgiven", ev)
	}
	if got := e.tokens(t, "tokens", "h"); got < -1000 || got > -999.999 {
		t.Errorf("after a report of 1e12: %v tokens, want -1000", got)
	}
	// Reports above it charge as much: they used to count as absent,
	// and the estimate stood.
	for _, u := range []string{"1000000000000.5", "99999999999999999999999", "9223372036854775807", strings.Repeat("9", 40)} {
		e.clock.Add(2 * time.Hour) // full again, from -1000
		e.get(t, "/?usage="+u, "X-Tenant: h")
		if ev := e.obs.next(t); ev != "tokens/forgiven" {
			t.Errorf("a report of %s: %s, want forgiven", u, ev)
		}
		if got := e.tokens(t, "tokens", "h"); got < -1000 || got > -999.999 {
			t.Errorf("after a report of %s: %v tokens, want -1000", u, got)
		}
	}
}

// TestCountStatusParallelHeld: a count_status rule's bound grows with the
// requests of a key in flight at once, which a client chooses; a
// concurrency rule on the same key beside it bounds them, so that 8
// clients failing logins in parallel, 20 attempts each, get at most the
// burst through (max_in_flight 1: burst + 1 - 1), each counted.
func TestCountStatusParallelHeld(t *testing.T) {
	const workers, attempts, burst = 8, 20, 5
	src := `{"rules": [
	{"name": "logins", "limit_keys": ["header:x-user"], "count_status": [401, 403],
	 "algorithm": "token_bucket", "algorithm_config": {"rate": 5, "period": "1h", "burst": 5, "max_reserved": 10}},
	{"name": "login-slots", "limit_keys": ["header:x-user"], "algorithm": "concurrency",
	 "algorithm_config": {"max_in_flight": 1}}]}`
	e := newSettleEnv(t, nil, src, loginHandler())
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range attempts {
				code, _ := e.get(t, "/", "X-User: p")
				switch code {
				case 401:
					failed.Add(1)
				case 429:
				default:
					t.Errorf("status %d", code)
					return
				}
			}
		})
	}
	wg.Wait()
	n := failed.Load()
	if n > burst {
		t.Errorf("%d failures got through, want at most %d", n, burst)
	}
	// Each failure's charge is settled after its response: wait for them.
	for range n {
		if ev := e.obs.next(t); ev != "logins/charged" {
			t.Errorf("%s", ev)
		}
	}
	if got, want := e.tokens(t, "logins", "p"), float64(burst-n); got != want {
		t.Errorf("%v tokens after %d failures, want %v", got, n, want)
	}
}

// TestSettleWindows: sliding and calendar windows hold no debt, so their
// settlements charge what the window has left and forgive the rest (the
// charge used to be refused as a reservation, and was lost: a
// cost_from_response paid its estimate only, a count_status rule counted
// nothing). Failed logins per calendar day in Berlin: five are counted,
// the sixth attempt is refused, and the next local day starts afresh.
func TestSettleWindows(t *testing.T) {
	for _, algo := range []string{
		`"algorithm": "sliding_window", "algorithm_config": {"rate": 1000, "period": "1h", "cost_source": "header:x-estimate", "default_cost": 100}`,
		`"algorithm": "fixed_window", "algorithm_config": {"rate": 1000, "period": "month", "time_zone": "Europe/Berlin", "cost_source": "header:x-estimate", "default_cost": 100}`,
	} {
		t.Run(strings.Split(algo, ",")[0], func(t *testing.T) {
			src := `{"rules": [{"name": "tokens", "limit_keys": ["header:x-tenant"], "cost_from_response": "header:x-usage", ` + algo + `}]}`
			e := newSettleEnv(t, nil, src, usageHandler())
			for _, s := range []struct {
				query, event string
				want         float64
			}{
				{"?usage=250", "tokens/charged", 750},
				{"?usage=20", "tokens/refunded", 730},
				{"?usage=5000", "tokens/forgiven", 0}, // 630 left after the estimate: all of it
			} {
				if code, _ := e.get(t, "/"+s.query, "X-Tenant: a"); code != 200 {
					t.Fatalf("%s: %d", s.query, code)
				}
				if ev := e.obs.next(t); ev != s.event {
					t.Errorf("%s: %s, want %s", s.query, ev, s.event)
				}
				if got := e.tokens(t, "tokens", "a"); got != s.want {
					t.Errorf("%s: %v tokens, want %v", s.query, got, s.want)
				}
			}
			if c, f := e.obs.moved("tokens/charged"), e.obs.moved("tokens/forgiven"); c != 150+630 || f != 4900-630 {
				t.Errorf("%v charged and %v forgiven, want %v and %v", c, f, 150+630, 4900-630)
			}
			if code, _ := e.get(t, "/?usage=1", "X-Tenant: a"); code != 429 {
				t.Errorf("the window used up: %d, want 429", code)
			}
		})
	}

	src := `{"rules": [{"name": "logins", "limit_keys": ["header:x-user"], "count_status": [401],
	 "algorithm": "fixed_window", "algorithm_config": {"rate": 5, "period": "day", "time_zone": "Europe/Berlin"}}]}`
	e := newSettleEnv(t, nil, src, loginHandler())
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Set(time.Date(2026, 3, 28, 23, 0, 0, 0, berlin)) // the day before summer time
	for i := range 5 {
		if code, _ := e.get(t, "/", "X-User: u"); code != 401 {
			t.Fatalf("failure %d: %d", i, code)
		}
		if ev := e.obs.next(t); ev != "logins/charged" {
			t.Fatalf("failure %d: %s", i, ev)
		}
	}
	if code, _ := e.get(t, "/", "X-User: u", "X-Password: right"); code != 429 {
		t.Fatalf("after 5 failures: %d, want 429", code)
	}
	e.clock.Set(time.Date(2026, 3, 29, 0, 0, 1, 0, berlin))
	if code, _ := e.get(t, "/", "X-User: u", "X-Password: right"); code != 200 {
		t.Errorf("the next day: %d, want 200", code)
	}
}

// TestMinCostFloorsAnAbort: a client that says its call costs nothing
// (an estimate of 0) and goes away before the response reports its
// cost pays the rule's min_cost, every time; a response that reports
// less than min_cost costs min_cost too.
func TestMinCostFloorsAnAbort(t *testing.T) {
	started := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u := r.URL.Query().Get("usage"); u != "" {
			w.Header().Set("Trailer", "X-Usage")
			defer w.Header().Set("X-Usage", u)
		}
		w.WriteHeader(200)
		http.NewResponseController(w).Flush()
		if r.URL.Query().Get("usage") != "" {
			return
		}
		started <- struct{}{}
		<-r.Context().Done() // until the client goes away
	})
	e := newSettleEnv(t, nil, `{"rules": [
	{"name": "tokens", "limit_keys": ["header:x-tenant"], "cost_from_response": "trailer:x-usage",
	 "algorithm_config": {"rate": 1000, "period": "1h", "cost_source": "header:x-estimate", "default_cost": 100, "min_cost": 40}}]}`, h)
	for i := range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/", nil)
		req.Header.Set("X-Tenant", "a")
		req.Header.Set("X-Estimate", "0")
		res, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		<-started
		cancel()
		res.Body.Close()
		if ev := e.obs.next(t); ev != "tokens/unreported" {
			t.Fatalf("abort %d: %s", i, ev)
		}
		if got, want := e.tokens(t, "tokens", "a"), 1000-40*float64(i+1); got != want {
			t.Fatalf("after abort %d: %v tokens, want %v", i, got, want)
		}
	}
	if code, _ := e.get(t, "/?usage=3", "X-Tenant: b", "X-Estimate: 0"); code != 200 {
		t.Fatal(code)
	}
	if ev := e.obs.next(t); ev != "tokens/settled" {
		t.Fatalf("a usage of 3: %s", ev)
	}
	if got := e.tokens(t, "tokens", "b"); got != 1000-40 {
		t.Errorf("a usage of 3 under min_cost 40: %v tokens", got)
	}
}

// TestLLMBodyReadAfterResponse: a handler that reads the body once more
// after its response has begun, as http.Transport does when a gateway
// forwards it (past Content-Length, to be sure nothing follows), sees the
// body's end, not an error. The body read for a rule's bound is handed on
// whole; net/http closes the request's own body once the response begins,
// and the error a read of it then gets made the transport drop the
// upstream connection, cutting a stream mid-way.
func TestLLMBodyReadAfterResponse(t *testing.T) {
	const body = `{"model":"m","max_tokens":10,"messages":[]}`
	errs := make(chan error, 1)
	e := newSettleEnv(t, nil, `{"rules": [
	{"name": "day", "limit_keys": ["header:x-tenant"], "cost_from_response": "openai",
	 "algorithm": "token_bucket",
	 "algorithm_config": {"rate": 100000, "period": "1h", "cost_source": "openai"}}]}`,
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, err := io.ReadFull(r.Body, make([]byte, r.ContentLength))
			if err == nil {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				_ = http.NewResponseController(w).Flush()
				_, err = r.Body.Read(make([]byte, 1))
			}
			errs <- err
		}))
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("X-Tenant", "a")
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	if err := <-errs; err != io.EOF {
		t.Errorf("a read of the body after the response began: %v, want io.EOF", err)
	}
}
