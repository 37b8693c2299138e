package grpclimit_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/grpclimit"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// env is a limiter in a real gRPC server on a loopback port, in front of
// gRPC's own health service (Check is unary, Watch a server stream that
// sends the current status, then each change), and a client connected to
// it.
type env struct {
	t      *testing.T
	lim    *grpclimit.Limiter
	clock  *testclock.Clock // shared by the limiter, the store and the test
	health *health.Server
	addr   string
	client healthpb.HealthClient
	hits   atomic.Int64 // calls that reached the service
}

func parse(t *testing.T, src string) *rules.Set {
	t.Helper()
	env := rules.Env{Getenv: func(name string) string {
		if name == "TEST_JWT_SECRET" {
			return hmacSecret
		}
		return ""
	}}
	set, err := rules.ParseEnv([]byte(src), filepath.Join(t.TempDir(), "rules.json"), env)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// newEnv serves set with state in store (nil: a memory store on the
// test's clock).
func newEnv(t *testing.T, store store.Store, set *rules.Set) *env {
	t.Helper()
	e := &env{t: t, clock: testclock.New(), health: health.NewServer()}
	if store == nil {
		ms := memstore.New(memstore.WithClock(e.clock.Now))
		t.Cleanup(func() { ms.Close() })
		store = ms
	}
	// A generous store deadline: the default 50 ms on a loaded machine
	// would let on_error decide.
	e.lim = grpclimit.New(store, set, engine.WithClock(e.clock.Now), engine.WithTimeout(teststores.Timeout),
		engine.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { e.lim.Close() })
	// Interceptors after the limiter's count the calls it let through.
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(e.lim.UnaryInterceptor(),
			func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				e.hits.Add(1)
				return h(ctx, req)
			}),
		grpc.ChainStreamInterceptor(e.lim.StreamInterceptor(),
			func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				e.hits.Add(1)
				return h(srv, ss)
			}))
	healthpb.RegisterHealthServer(srv, e.health)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	e.addr = ln.Addr().String()
	e.client = e.dial("127.0.0.1")
	return e
}

// dial connects to the server from the loopback address local, so that
// tests can be several peers.
func (e *env) dial(local string) healthpb.HealthClient {
	e.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	conn, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// ctx is a generous deadline and outgoing metadata kv (name, value, ...).
func (e *env) ctx(kv ...string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), teststores.Timeout)
	e.t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// answer is a call's status and response header metadata.
type answer struct {
	st *status.Status
	md metadata.MD
}

func (a answer) code() codes.Code { return a.st.Code() }

func (a answer) get(name string) string {
	if vs := a.md.Get(name); len(vs) == 1 {
		return vs[0]
	}
	return ""
}

// check makes a unary call from c with metadata kv.
func (e *env) check(c healthpb.HealthClient, kv ...string) answer {
	e.t.Helper()
	var md metadata.MD
	_, err := c.Check(e.ctx(kv...), &healthpb.HealthCheckRequest{}, grpc.Header(&md))
	return answer{status.Convert(err), md}
}

// watch opens a stream from c with metadata kv and reads its first
// message; the stream stays open.
func (e *env) watch(c healthpb.HealthClient, kv ...string) (answer, healthpb.Health_WatchClient) {
	e.t.Helper()
	s, err := c.Watch(e.ctx(kv...), &healthpb.HealthCheckRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	_, err = s.Recv()
	md, herr := s.Header()
	if herr != nil && err == nil {
		e.t.Fatal(herr)
	}
	return answer{status.Convert(err), md}, s
}

// details returns the RetryInfo and ErrorInfo details of a status.
func details(t *testing.T, st *status.Status) (*errdetails.RetryInfo, *errdetails.ErrorInfo) {
	t.Helper()
	var ri *errdetails.RetryInfo
	var ei *errdetails.ErrorInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			ri = d
		case *errdetails.ErrorInfo:
			ei = d
		case error:
			t.Fatalf("detail: %v", d)
		}
	}
	return ri, ei
}

// noJitter makes Retry-After the wait itself, so that tests know it.
const noJitter = `"retry_after_jitter": {"fraction": 0},`

func TestUnary(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{`+noJitter+` "rules": [
		{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1m", "burst": 2}}]}`))
	for i, want := range []string{`"per-key";r=1;t=60`, `"per-key";r=0;t=120`} {
		a := e.check(e.client, "x-api-key", "k")
		if a.code() != codes.OK {
			t.Fatalf("call %d: %v", i+1, a.st)
		}
		if got := a.get("ratelimit"); got != want {
			t.Errorf("call %d: ratelimit %q, want %q", i+1, got, want)
		}
		if got := a.get("ratelimit-policy"); got != `"per-key";q=2;w=120` {
			t.Errorf("call %d: ratelimit-policy %q", i+1, got)
		}
		if a.get("retry-after") != "" {
			t.Errorf("call %d: retry-after on an allowed call", i+1)
		}
	}
	a := e.check(e.client, "x-api-key", "k")
	if a.code() != codes.ResourceExhausted {
		t.Fatalf("third call: %v", a.st)
	}
	ri, ei := details(t, a.st)
	if ri == nil || ri.RetryDelay.AsDuration() != time.Minute {
		t.Errorf("RetryInfo %v, want 60s", ri)
	}
	if ei == nil || ei.Reason != "TOKEN_BUCKET_EXCEEDED" || ei.Domain != grpclimit.ErrorDomain || ei.Metadata["rule"] != "per-key" {
		t.Errorf("ErrorInfo %v", ei)
	}
	for name, want := range map[string]string{"retry-after": "60", "ratelimit": `"per-key";r=0;t=60`,
		"ratelimit-policy": `"per-key";q=2;w=120`, "ratelimit-limit": "2", "ratelimit-remaining": "0", "ratelimit-reset": "60"} {
		if got := a.get(name); got != want {
			t.Errorf("denied: %s %q, want %q", name, got, want)
		}
	}
	if n := e.hits.Load(); n != 2 {
		t.Errorf("%d calls reached the service, want 2", n)
	}
	// A denial took nothing: a minute later one token is back.
	e.clock.Add(time.Minute)
	if a := e.check(e.client, "x-api-key", "k"); a.code() != codes.OK || a.get("ratelimit") != `"per-key";r=0;t=120` {
		t.Errorf("a minute later: %v %v", a.st, a.md)
	}
	// A call no rule decides carries no RateLimit metadata.
	if a := e.check(e.client); a.code() != codes.OK || len(a.md.Get("ratelimit")) > 0 {
		t.Errorf("no key: %v %v", a.st, a.md)
	}
}

// TestJitter: with the default jitter, RetryInfo holds the retry-after
// value, which the denying rule's t equals.
func TestJitter(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"rules": [
		{"name": "g", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "10s"}}]}`))
	e.check(e.client)
	a := e.check(e.client)
	ri, _ := details(t, a.st)
	if a.code() != codes.ResourceExhausted || ri == nil {
		t.Fatalf("%v", a.st)
	}
	ra, err := strconv.Atoi(a.get("retry-after"))
	if err != nil || ra < 10 || ra > 15 {
		t.Fatalf("retry-after %q, want 10 to 15", a.get("retry-after"))
	}
	if ri.RetryDelay.AsDuration() != time.Duration(ra)*time.Second {
		t.Errorf("RetryInfo %v, retry-after %d", ri.RetryDelay.AsDuration(), ra)
	}
	if got, want := a.get("ratelimit"), `"g";r=0;t=`+strconv.Itoa(ra); got != want {
		t.Errorf("ratelimit %q, want %q", got, want)
	}
}

// TestStream: a stream is decided once, when it opens; its messages are
// not counted.
func TestStream(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{`+noJitter+` "rules": [
		{"name": "streams", "limit_keys": ["path"], "algorithm_config": {"rate": 1, "period": "1m", "burst": 2}}]}`))
	a, first := e.watch(e.client)
	if a.code() != codes.OK || a.get("ratelimit") != `"streams";r=1;t=60` {
		t.Fatalf("first stream: %v %v", a.st, a.md)
	}
	if a, _ := e.watch(e.client); a.code() != codes.OK {
		t.Fatalf("second stream: %v", a.st)
	}
	a, _ = e.watch(e.client)
	if a.code() != codes.ResourceExhausted {
		t.Fatalf("third stream: %v", a.st)
	}
	if ri, _ := details(t, a.st); ri == nil || ri.RetryDelay.AsDuration() != time.Minute {
		t.Errorf("RetryInfo %v", ri)
	}
	if a.get("ratelimit") != `"streams";r=0;t=60` || a.get("retry-after") != "60" {
		t.Errorf("denied stream metadata %v", a.md)
	}
	// The open stream goes on after the bucket is empty.
	for _, s := range []healthpb.HealthCheckResponse_ServingStatus{healthpb.HealthCheckResponse_NOT_SERVING, healthpb.HealthCheckResponse_SERVING} {
		e.health.SetServingStatus("", s)
		if m, err := first.Recv(); err != nil || m.Status != s {
			t.Fatalf("open stream: %v %v", m, err)
		}
	}
	if n := e.hits.Load(); n != 2 {
		t.Errorf("%d streams reached the service, want 2", n)
	}
	// Unary calls have a path of their own.
	if a := e.check(e.client); a.code() != codes.OK {
		t.Errorf("Check: %v", a.st)
	}
}

// exhaust makes calls until one is denied, and returns how many were
// allowed (at most 10).
func (e *env) exhaust(c healthpb.HealthClient, kv ...string) int {
	e.t.Helper()
	for n := range 10 {
		if a := e.check(c, kv...); a.code() != codes.OK {
			if a.code() != codes.ResourceExhausted {
				e.t.Fatalf("call %d: %v", n+1, a.st)
			}
			return n
		}
	}
	return 10
}

// TestKeys: each kind of key selects buckets of its own.
func TestKeys(t *testing.T) {
	const limit = `"algorithm_config": {"rate": 1, "period": "1m", "burst": 2}`
	t.Run("metadata", func(t *testing.T) {
		e := newEnv(t, nil, parse(t, `{"rules": [{"name": "k", "limit_keys": ["header:x-api-key"], `+limit+`}]}`))
		for _, k := range []string{"a", "b"} {
			if n := e.exhaust(e.client, "x-api-key", k); n != 2 {
				t.Errorf("key %s: %d allowed, want 2", k, n)
			}
		}
		// A key sent twice is keyed on both values: a bucket of its own.
		if n := e.exhaust(e.client, "x-api-key", "a", "x-api-key", "b"); n != 2 {
			t.Errorf("both keys: %d allowed, want 2", n)
		}
	})
	t.Run("method", func(t *testing.T) {
		e := newEnv(t, nil, parse(t, `{`+noJitter+` "rules": [
			{"name": "m", "limit_keys": ["path"], "match": {"path": "/grpc.health.v1.Health/*", "method": "POST"}, `+limit+`},
			{"name": "never", "limit_keys": ["global"], "match": {"method": "GET"}, "algorithm_config": {"rate": 1, "period": "1m"}}]}`))
		if n := e.exhaust(e.client); n != 2 {
			t.Errorf("Check: %d allowed, want 2", n)
		}
		if a, _ := e.watch(e.client); a.code() != codes.OK || a.get("ratelimit") != `"m";r=1;t=60` {
			t.Errorf("Watch: %v %v", a.st, a.md)
		}
	})
	t.Run("peer", func(t *testing.T) {
		e := newEnv(t, nil, parse(t, `{"rules": [{"name": "ip", "limit_keys": ["ip:address"], `+limit+`}]}`))
		if n := e.exhaust(e.client); n != 2 {
			t.Errorf("127.0.0.1: %d allowed, want 2", n)
		}
		if n := e.exhaust(e.dial("127.0.0.2")); n != 2 {
			t.Errorf("127.0.0.2: %d allowed, want 2", n)
		}
	})
	t.Run("jwt", func(t *testing.T) {
		e := newEnv(t, nil, parse(t, `{"jwt": {"hmac_secret_env": "TEST_JWT_SECRET"}, "rules": [
			{"name": "user", "limit_keys": ["jwt:sub"], `+limit+`}]}`))
		e.clock.Set(time.Now()) // tokens carry real times
		for _, sub := range []string{"alice", "bob"} {
			if n := e.exhaust(e.client, "authorization", "Bearer "+token(t, hmacSecret, sub)); n != 2 {
				t.Errorf("%s: %d allowed, want 2", sub, n)
			}
		}
		// A forged token has no claims: the rule does not apply.
		forged := token(t, "another-secret-of-at-least-32-bytes", "carol")
		if n := e.exhaust(e.client, "authorization", "Bearer "+forged); n != 10 {
			t.Errorf("forged: %d allowed, want all", n)
		}
		if a := e.check(e.client, "authorization", "Bearer "+forged); len(a.md.Get("ratelimit")) > 0 {
			t.Errorf("forged token decided: %v", a.md)
		}
	})
}

const hmacSecret = "a-test-secret-of-at-least-32-bytes!"

func token(t *testing.T, secret, sub string) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestForwardedFor: x-forwarded-for is believed from trusted proxies only.
func TestForwardedFor(t *testing.T) {
	const rule = `"rules": [{"name": "ip", "limit_keys": ["ip:address"], "algorithm_config": {"rate": 1, "period": "1m", "burst": 2}}]}`
	e := newEnv(t, nil, parse(t, `{"trusted_proxies": ["10.0.0.0/8"], `+rule))
	total := 0
	for _, xff := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"} {
		total += e.exhaust(e.client, "x-forwarded-for", xff)
	}
	if total != 2 {
		t.Errorf("an untrusted peer's x-forwarded-for: %d allowed, want 2 in all", total)
	}
	// From a trusted peer, each forwarded client has its bucket.
	e = newEnv(t, nil, parse(t, `{"trusted_proxies": ["127.0.0.1"], `+rule))
	for _, xff := range []string{"198.51.100.1", "198.51.100.2"} {
		if n := e.exhaust(e.client, "x-forwarded-for", xff); n != 2 {
			t.Errorf("trusted peer, client %s: %d allowed, want 2", xff, n)
		}
	}
}

// TestCost: costs come from metadata; a cost above the burst is denied
// without RetryInfo, since waiting cannot help.
func TestCost(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"rules": [{"name": "c", "limit_keys": ["global"],
		"algorithm_config": {"rate": 1, "period": "1m", "burst": 5, "cost_source": "header:x-cost"}}]}`))
	if a := e.check(e.client, "x-cost", "3"); a.code() != codes.OK || a.get("ratelimit-remaining") != "2" {
		t.Fatalf("cost 3: %v %v", a.st, a.md)
	}
	if a := e.check(e.client, "x-cost", "3"); a.code() != codes.ResourceExhausted {
		t.Fatalf("cost 3 of 2 left: %v", a.st)
	}
	a := e.check(e.client, "x-cost", "6")
	ri, ei := details(t, a.st)
	if a.code() != codes.ResourceExhausted || ri != nil || ei == nil || ei.Reason != "COST_EXCEEDS_BURST" || a.get("retry-after") != "" {
		t.Errorf("cost above the burst: %v %v %v %v", a.st, ri, ei, a.md)
	}
	if n := e.hits.Load(); n != 1 {
		t.Errorf("%d calls reached the service, want 1", n)
	}
}

// downStore fails every call.
type downStore struct{ store.Store }

var errDown = errors.New("connection refused")

func (downStore) Apply(context.Context, bucket.Op, time.Time, []bucket.Prepared, []bucket.Result) error {
	return errDown
}

// Caps are the store's, but not InProcess: it stands for a store on a
// server, whose calls get a deadline.
func (d downStore) Caps() store.Caps {
	c := d.Store.Caps()
	c.InProcess = false
	return c
}

func TestStoreDown(t *testing.T) {
	const limit = `"limit_keys": ["global"], "algorithm_config": {"rps": 1}`
	down := downStore{memstore.New()}
	t.Cleanup(func() { down.Store.(*memstore.Store).Close() })

	e := newEnv(t, down, parse(t, `{"rules": [{"name": "strict", "on_error": "deny", `+limit+`}]}`))
	a := e.check(e.client)
	_, ei := details(t, a.st)
	if a.code() != codes.Unavailable || ei == nil || ei.Reason != "STORE_UNAVAILABLE" || ei.Metadata["rule"] != "strict" {
		t.Errorf("on_error deny: %v %v", a.st, ei)
	}
	if a, _ := e.watch(e.client); a.code() != codes.Unavailable {
		t.Errorf("on_error deny, stream: %v", a.st)
	}
	if n := e.hits.Load(); n != 0 {
		t.Errorf("%d calls reached the service", n)
	}

	e = newEnv(t, down, parse(t, `{"rules": [{"name": "lenient", "on_error": "allow", `+limit+`}]}`))
	if a := e.check(e.client); a.code() != codes.OK || len(a.md.Get("ratelimit")) > 0 {
		t.Errorf("on_error allow: %v %v", a.st, a.md)
	}
	if a, _ := e.watch(e.client); a.code() != codes.OK {
		t.Errorf("on_error allow, stream: %v", a.st)
	}

	// local: a per-instance limiter at half the burst (4) decides.
	e = newEnv(t, down, parse(t, `{"rules": [{"name": "fallback", "on_error": "local", "local_share": 0.5,
		"limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1m", "burst": 4}}]}`))
	if n := e.exhaust(e.client); n != 2 {
		t.Errorf("on_error local: %d allowed, want 2", n)
	}
}

// TestConcurrent: calls racing for one bucket are granted its burst
// exactly.
func TestConcurrent(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"rules": [{"name": "g", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1m", "burst": 5}}]}`))
	codesc := make(chan codes.Code, 40)
	for range 40 {
		go func() {
			_, err := e.client.Check(e.ctx(), &healthpb.HealthCheckRequest{})
			codesc <- status.Code(err)
		}()
	}
	got := map[codes.Code]int{}
	for range 40 {
		got[<-codesc]++
	}
	if got[codes.OK] != 5 || got[codes.ResourceExhausted] != 35 {
		t.Errorf("%v, want 5 OK and 35 ResourceExhausted", got)
	}
	if n := e.hits.Load(); n != 5 {
		t.Errorf("%d calls reached the service, want 5", n)
	}
}

// TestSwap: new rules apply to the next call, and a rule that keeps its
// name keeps its bucket.
func TestSwap(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"rules": [{"name": "g", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1m", "burst": 3}}]}`))
	e.check(e.client)
	e.lim.Swap(parse(t, `{"rules": [{"name": "g", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1m", "burst": 3}, "match": {"path": "/other.Service/*"}}]}`))
	if a := e.check(e.client); a.code() != codes.OK || len(a.md.Get("ratelimit")) > 0 {
		t.Errorf("after a swap to rules that do not match: %v", a.md)
	}
	e.lim.Swap(parse(t, `{"rules": [{"name": "g", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "1m", "burst": 3}}]}`))
	if a := e.check(e.client); a.get("ratelimit-remaining") != "1" {
		t.Errorf("after a swap back: %v", a.md)
	}
	if e.lim.Rules().Rules[0].Name != "g" {
		t.Error("Rules() is not the swapped set")
	}
}

// TestSharedWithMiddleware: the middleware and the interceptors on one
// engine and one rules file key a client alike, so an API key's HTTP
// requests and gRPC calls draw from one bucket.
func TestSharedWithMiddleware(t *testing.T) {
	set := parse(t, `{"rules": [{"name": "k", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1m", "burst": 3}}]}`)
	e := newEnv(t, nil, set)
	web := httplimit.New(nil, set, engine.Shared(e.lim.Engine()))
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Api-Key", "k")
	if res := web.Decide(context.Background(), r); !res.Allowed {
		t.Fatalf("HTTP: %+v", res)
	}
	if a := e.check(e.client, "x-api-key", "k"); a.code() != codes.OK || a.get("ratelimit-remaining") != "1" {
		t.Errorf("gRPC after one HTTP request: %v %v", a.st, a.md)
	}
}

// TestShadow: a shadow rule never denies a call, nor shows in its
// metadata, however far over its limit the caller is.
func TestShadow(t *testing.T) {
	e := newEnv(t, nil, parse(t, `{"rules": [
		{"name": "watch", "mode": "shadow", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h"}}]}`))
	for i := range 3 {
		a := e.check(e.client, "x-api-key", "k")
		if a.code() != codes.OK || len(a.md.Get("ratelimit")) > 0 {
			t.Fatalf("call %d: %v %v", i+1, a.st, a.md)
		}
	}
	if n := e.hits.Load(); n != 3 {
		t.Errorf("%d calls reached the service, want 3", n)
	}
}
