package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// running is a server on port 0 serving in the background.
type running struct {
	*Server
	base, admin string
	cancel      func()       // ends Serve's context: the drain begins
	stop        func() error // cancel, and wait for Serve to return
}

// start serves cfg on free loopback ports until the test ends.
func start(t testing.TB, cfg Config, store store.Store) *running {
	t.Helper()
	return startWith(t, cfg, store, nil)
}

// startWatched is start with the rules watcher driven by the test: poll
// makes it poll the rules files once, and returns when it has.
func startWatched(t *testing.T, cfg Config, store store.Store) (srv *running, poll func()) {
	t.Helper()
	tick, polled := make(chan time.Time), make(chan struct{})
	srv = startWith(t, cfg, store, func(s *Server) {
		s.watchTick = tick
		s.watchPolled = func() { polled <- struct{}{} }
	})
	return srv, func() {
		t.Helper()
		tick <- time.Time{}
		<-polled
	}
}

// startWith is start with setup applied to the server before it serves.
func startWith(t testing.TB, cfg Config, store store.Store, setup func(*Server)) *running {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	if cfg.StoreTimeout == 0 {
		// The default 500 ms on a loaded machine would let on_error
		// decide; tests of the deadline set their own.
		cfg.StoreTimeout = teststores.Timeout
	}
	if cfg.AdminListen == "" {
		cfg.AdminListen = "127.0.0.1:0"
	}
	if cfg.Drain == 0 {
		cfg.Drain = -1 // tests of the drain set their own
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := New(cfg, store)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if setup != nil {
		setup(s)
	}
	if err := s.Listen(); err != nil {
		t.Fatalf("Listen: %v", err)
	}
	serving := make(chan struct{})
	s.serving = func() { close(serving) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	// Return once Serve runs all it runs, so that a test that counts
	// goroutines counts them from a server in its steady state.
	select {
	case <-serving:
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not start within 30 s")
	}
	var once sync.Once
	var serr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case serr = <-done:
			case <-time.After(15 * time.Second):
				serr = errors.New("Serve did not return after cancel")
			}
		})
		return serr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	r := &running{Server: s, base: "http://" + s.Addr().String(), cancel: cancel, stop: stop}
	if a := s.AdminAddr(); a != nil {
		r.admin = "http://" + a.String()
	}
	return r
}

// call sends a request and returns the status and the body.
func call(t testing.TB, method, url, body string, hdr ...string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	return call(t, http.MethodPost, url, body, "Content-Type", "application/json")
}

func decision(t *testing.T, body string) drip.Decision {
	t.Helper()
	var d drip.Decision
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatalf("decision %s: %v", body, err)
	}
	return d
}

const lim = `"limit": {"rate": 1, "period": "1h", "burst": 3}`

func TestDecisionAPIInline(t *testing.T) {
	// The store decides at a time of the test's: 1 token an hour refills
	// nothing between two calls, however slow the machine.
	srv := start(t, Config{}, memstore.New(memstore.WithClock(testclock.New().Now)))
	take := func(body string) drip.Decision {
		t.Helper()
		code, out := post(t, srv.base+"/v1/take", body)
		if code != http.StatusOK {
			t.Fatalf("take %s: %d %s", body, code, out)
		}
		return decision(t, out)
	}
	k := `"key": "user:1", ` + lim
	for i, want := range []int64{2, 1, 0} {
		d := take(`{` + k + `}`)
		if !d.Allowed || d.Remaining != want || d.Burst != 3 {
			t.Fatalf("take %d: %+v, want allowed with %d remaining", i, d, want)
		}
	}
	d := take(`{` + k + `}`)
	if d.Allowed || d.Tokens != 0 || d.RetryAfter != time.Hour {
		t.Fatalf("fourth take: %+v, want denied with retry_after 1h", d)
	}

	// peek changes nothing; refund gives back; reset fills.
	code, out := post(t, srv.base+"/v1/peek", `{`+k+`}`)
	if d := decision(t, out); code != 200 || d.Allowed || d.Remaining != 0 {
		t.Fatalf("peek: %d %s", code, out)
	}
	code, out = post(t, srv.base+"/v1/refund", `{`+k+`, "cost": 2}`)
	if d := decision(t, out); code != 200 || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("refund: %d %s", code, out)
	}
	code, out = post(t, srv.base+"/v1/reset", `{"key": "user:1"}`)
	if code != 200 || strings.TrimSpace(out) != `{"reset":true}` {
		t.Fatalf("reset: %d %s", code, out)
	}
	if d := take(`{` + k + `, "cost": 3}`); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("take 3 after reset: %+v", d)
	}
	// a reservation goes into debt and says when to run.
	if d := take(`{` + k + `, "reserve": true}`); !d.Allowed || d.Tokens != -1 || d.RetryAfter != time.Hour {
		t.Fatalf("reserve: %+v", d)
	}

	// multi-take: all or nothing.
	multi := `{"requests": [{"key": "a", ` + lim + `, "cost": 2}, {"key": "b", ` + lim + `, "cost": 3}]}`
	code, out = post(t, srv.base+"/v1/take", multi)
	var m drip.Multi
	if err := json.Unmarshal([]byte(out), &m); code != 200 || err != nil || !m.Allowed || len(m.Decisions) != 2 {
		t.Fatalf("multi-take: %d %s", code, out)
	}
	code, out = post(t, srv.base+"/v1/take", multi)
	if err := json.Unmarshal([]byte(out), &m); code != 200 || err != nil || m.Allowed || m.Decisions[0].Allowed || m.Decisions[1].Allowed {
		t.Fatalf("second multi-take: %d %s", code, out)
	}
	code, out = post(t, srv.base+"/v1/peek", `{"key": "a", `+lim+`}`)
	if d := decision(t, out); code != 200 || !d.Allowed || d.Remaining != 0 { // 1 left, as after the first multi-take
		t.Fatalf("a denied multi-take consumed: %s", out)
	}
}

func TestDecisionAPIErrors(t *testing.T) {
	srv := start(t, Config{}, memstore.New())
	for _, tc := range []struct {
		name, method, path, body string
		code                     int
		msg                      string
	}{
		{"empty body", "POST", "/v1/take", "", 400, "empty body"},
		{"not JSON", "POST", "/v1/take", "{", 400, "bad JSON"},
		{"unknown field", "POST", "/v1/take", `{"key": "k", ` + lim + `, "kost": 1}`, 400, `unknown field "kost"`},
		{"unknown limit field", "POST", "/v1/take", `{"key": "k", "limit": {"rate": 1, "brust": 2}}`, 400, `unknown field "brust"`},
		{"two values", "POST", "/v1/take", `{"key": "k", ` + lim + `} {}`, 400, "more than one value"},
		{"op field", "POST", "/v1/take", `{"op": "take", "key": "k", ` + lim + `}`, 400, `unknown field "op"`},
		{"missing key", "POST", "/v1/take", `{` + lim + `}`, 400, "missing key"},
		{"missing limit", "POST", "/v1/take", `{"key": "k"}`, 400, "missing limit"},
		{"zero rate", "POST", "/v1/take", `{"key": "k", "limit": {"rate": 0}}`, 400, "rate must be > 0"},
		{"bad period", "POST", "/v1/take", `{"key": "k", "limit": {"rate": 1, "period": "soon"}}`, 400, "not a duration"},
		{"negative cost", "POST", "/v1/take", `{"key": "k", ` + lim + `, "cost": -1}`, 400, "invalid cost"},
		{"cost over burst", "POST", "/v1/take", `{"key": "k", ` + lim + `, "cost": 4}`, 400, "cost exceeds burst"},
		{"reservation that can never fit", "POST", "/v1/take", `{"key": "k", "limit": {"rate": 4, "burst": 1, "max_reserved": 3}, "cost": 5, "reserve": true}`, 400, "can never be reserved"},
		{"peek at a reservation that can never fit", "POST", "/v1/peek", `{"key": "k", "limit": {"rate": 4, "burst": 1, "max_reserved": 3}, "cost": 5, "reserve": true}`, 400, "can never be reserved"},
		{"multi reservation that can never fit", "POST", "/v1/take", `{"requests": [{"key": "a", ` + lim + `}, {"key": "b", "limit": {"rate": 4, "burst": 1, "max_reserved": 3}, "cost": 5, "reserve": true}]}`, 400, "requests[1]: cost exceeds burst"},
		{"cost as string", "POST", "/v1/take", `{"key": "k", ` + lim + `, "cost": "1"}`, 400, "bad JSON"},
		{"reset with limit", "POST", "/v1/reset", `{"key": "k", ` + lim + `}`, 400, "only key"},
		{"values without rule", "POST", "/v1/take", `{"values": ["x"]}`, 400, "values need a rule"},
		{"rule with key", "POST", "/v1/take", `{"rule": "r", "key": "k"}`, 400, "instead of key"},
		{"unknown rule", "POST", "/v1/take", `{"rule": "no-such-rule", "values": ["x"]}`, 404, `unknown rule "no-such-rule"`},
		{"multi with key", "POST", "/v1/take", `{"key": "k", "requests": [{"key": "a", ` + lim + `}]}`, 400, "instead of key"},
		{"multi refund", "POST", "/v1/refund", `{"requests": [{"key": "a", ` + lim + `}]}`, 400, "does not take requests"},
		{"multi empty", "POST", "/v1/take", `{"requests": []}`, 400, "no requests"},
		{"multi bad item", "POST", "/v1/take", `{"requests": [{"key": "a", ` + lim + `}, {"key": "b"}]}`, 400, "requests[1]: invalid limit: missing limit"},
		{"multi duplicate", "POST", "/v1/take", `{"requests": [{"key": "a", ` + lim + `}, {"key": "a", ` + lim + `}]}`, 400, "duplicate key"},
		{"multi of one over its burst", "POST", "/v1/take", `{"requests": [{"key": "a", ` + lim + `, "cost": 4}]}`, 400, "requests[0]: cost exceeds burst"},
		{"multi waiting, second bad", "POST", "/v1/take", `{"wait": "1s", "requests": [{"key": "a", ` + lim + `}, {"key": "b", ` + lim + `, "cost": -1}]}`, 400, "requests[1]: invalid cost"},
		{"multi waiting duplicate", "POST", "/v1/take", `{"wait": "1s", "requests": [{"key": "a", ` + lim + `}, {"key": "a", ` + lim + `}]}`, 400, "duplicate key"},
		{"multi unknown rule", "POST", "/v1/peek", `{"requests": [{"rule": "nope", "values": []}]}`, 404, `requests[0]: unknown rule "nope"`},
		{"too big", "POST", "/v1/take", `{"key": "` + strings.Repeat("x", maxBody) + `"}`, 413, "body over"},
		{"GET", "GET", "/v1/take", "", 405, "use POST"},
		{"unknown path", "POST", "/v1/tak", `{}`, 404, "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := call(t, tc.method, srv.base+tc.path, tc.body)
			var e struct{ Error string }
			if err := json.Unmarshal([]byte(out), &e); err != nil || e.Error == "" {
				t.Fatalf("error body %q is not {\"error\": ...}", out)
			}
			if code != tc.code || !strings.Contains(e.Error, tc.msg) {
				t.Fatalf("%s %s %.80s: got %d %q, want %d with %q", tc.method, tc.path, tc.body, code, e.Error, tc.code, tc.msg)
			}
		})
	}
}

// failing is a store that is down: every call fails like a lost
// connection (after checking its input, as every store does).
type failing struct{}

var errDown = errors.New("dial tcp 127.0.0.1:1: connection refused")

func (failing) Apply(context.Context, bucket.Op, time.Time, []bucket.Prepared, []bucket.Result) error {
	return errDown
}

func (failing) Caps() store.Caps { return store.Caps{} }

func (failing) Reset(context.Context, string) error { return errDown }

func TestDecisionAPIStoreDown(t *testing.T) {
	srv := start(t, Config{}, failing{})
	for _, path := range []string{"/v1/take", "/v1/peek", "/v1/refund"} {
		code, out := post(t, srv.base+path, `{"key": "k", `+lim+`}`)
		if code != http.StatusServiceUnavailable || !strings.Contains(out, "store: dial tcp") {
			t.Fatalf("%s with the store down: %d %s, want 503 with the reason", path, code, out)
		}
	}
	code, out := post(t, srv.base+"/v1/reset", `{"key": "k"}`)
	if code != 503 {
		t.Fatalf("reset with the store down: %d %s", code, out)
	}
	// Bad input is still the caller's fault.
	if code, out := post(t, srv.base+"/v1/take", `{"key": "k", "limit": {"rate": -1}}`); code != 400 {
		t.Fatalf("bad limit with the store down: %d %s, want 400", code, out)
	}
	code, out = call(t, "GET", srv.admin+"/readyz", "")
	if code != 503 || !strings.Contains(out, "connection refused") {
		t.Fatalf("/readyz with the store down: %d %s", code, out)
	}
	_, metrics := call(t, "GET", srv.admin+"/metrics", "")
	for _, want := range []string{`drip_store_errors_total{op="take"} 1`, `drip_decisions_total{mode="enforce",outcome="error",rule="inline"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestAdminAuth(t *testing.T) {
	const token = "s3cret"
	srv := start(t, Config{AdminToken: token}, memstore.New())
	paths := []struct{ method, path, body string }{
		{"GET", "/v1/admin/bucket?rule=x&value=1", ""},
		{"POST", "/v1/admin/reset", `{"key": "k"}`},
		{"POST", "/v1/admin/reload", ""},
		{"GET", "/v1/admin/rules", ""},
		{"GET", "/v1/admin/nothing-here", ""},
	}
	for _, p := range paths {
		for _, auth := range []string{"", "Bearer wrong", "Bearer " + token + "x", "Basic " + token, token} {
			code, out := call(t, p.method, srv.admin+p.path, p.body, "Authorization", auth)
			if code != http.StatusUnauthorized {
				t.Errorf("%s %s with Authorization %q: %d %s, want 401", p.method, p.path, auth, code, out)
			}
		}
	}
	code, out := call(t, "POST", srv.admin+"/v1/admin/reset", `{"key": "k"}`, "Authorization", "Bearer "+token)
	if code != 200 || !strings.Contains(out, `"reset":true`) {
		t.Fatalf("reset with the token: %d %s", code, out)
	}
	// The scheme is matched without regard to case, as HTTP says.
	if code, out := call(t, "GET", srv.admin+"/v1/admin/rules", "", "Authorization", "bearer "+token); code != 200 {
		t.Errorf("scheme in lower case: %d %s, want 200", code, out)
	}
	// Two Authorization headers are refused, whichever comes first.
	for _, pair := range [][2]string{{"Bearer " + token, "Bearer wrong"}, {"Bearer wrong", "Bearer " + token}} {
		req, _ := http.NewRequest("GET", srv.admin+"/v1/admin/rules", nil)
		req.Header.Add("Authorization", pair[0])
		req.Header.Add("Authorization", pair[1])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("two Authorization headers %q: %d, want 401", pair, resp.StatusCode)
		}
	}
	// Metrics and health need no token.
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		if code, out := call(t, "GET", srv.admin+p, ""); code != 200 {
			t.Errorf("%s: %d %s", p, code, out)
		}
	}

	off := start(t, Config{}, memstore.New())
	for _, p := range paths {
		code, out := call(t, p.method, off.admin+p.path, p.body, "Authorization", "Bearer ")
		if code != http.StatusNotFound || !strings.Contains(out, "admin API is off") {
			t.Errorf("%s %s without an admin token configured: %d %s, want 404", p.method, p.path, code, out)
		}
	}
}

// blocking is a memory store whose takes wait for release.
type blocking struct {
	store.Store
	entered chan struct{}
	release chan struct{}
}

func (b *blocking) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if len(items) == 1 && items[0].Key != readyKey {
		b.entered <- struct{}{}
		<-b.release
	}
	return b.Store.Apply(ctx, op, at, items, results)
}

// Caps are the store's, but not InProcess: it stands for a store on a
// server, whose calls get a deadline.
func (b *blocking) Caps() store.Caps {
	c := b.Store.Caps()
	c.InProcess = false
	return c
}

func TestGracefulShutdown(t *testing.T) {
	st := &blocking{Store: memstore.New(), entered: make(chan struct{}), release: make(chan struct{})}
	srv := start(t, Config{StoreTimeout: time.Minute}, st)
	type result struct {
		code int
		body string
	}
	got := make(chan result, 1)
	go func() {
		resp, err := http.Post(srv.base+"/v1/take", "application/json", strings.NewReader(`{"key": "k", `+lim+`}`))
		if err != nil {
			got <- result{0, err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- result{resp.StatusCode, string(b)}
	}()
	<-st.entered // the request is in flight
	stopped := make(chan error, 1)
	go func() { stopped <- srv.stop() }()
	// The listener closes at once; Serve waits for the request.
	deadline := time.Now().Add(30 * time.Second) // generous: when is not what is tested
	for {
		_, err := http.Post(srv.base+"/v1/take", "application/json", strings.NewReader(`{}`))
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the listener still accepts after shutdown began")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-stopped:
		t.Fatalf("Serve returned (%v) with a request in flight", err)
	default:
	}
	close(st.release)
	r := <-got
	if r.code != 200 || decision(t, r.body).Remaining != 2 {
		t.Fatalf("in-flight request during shutdown: %d %s", r.code, r.body)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Serve after graceful shutdown: %v", err)
	}
}

func TestMetrics(t *testing.T) {
	srv := start(t, Config{}, memstore.New())
	for range 4 {
		post(t, srv.base+"/v1/take", `{"key": "m", `+lim+`}`)
	}
	post(t, srv.base+"/v1/peek", `{"key": "m", `+lim+`}`)
	code, out := call(t, "GET", srv.admin+"/metrics", "")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`drip_decisions_total{mode="enforce",outcome="allowed",rule="inline"} 3`,
		`drip_decisions_total{mode="enforce",outcome="denied",rule="inline"} 1`,
		`drip_store_duration_seconds_count{op="take"} 4`,
		`drip_store_duration_seconds_count{op="peek"} 1`,
		`drip_rules_last_reload_ok`,
		`go_goroutines`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(grep(out, "drip_"))
	}
}

func grep(s, sub string) string {
	var b bytes.Buffer
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
