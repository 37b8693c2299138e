package server

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/store/memstore"
)

// ended is a span processor that hands each ended span to the test: a
// server span ends after its response was sent, so the test waits for it
// rather than reading a recorder too early.
type ended chan sdktrace.ReadOnlySpan

func (c ended) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c ended) OnEnd(s sdktrace.ReadOnlySpan)                   { c <- s }
func (c ended) Shutdown(context.Context) error                  { return nil }
func (c ended) ForceFlush(context.Context) error                { return nil }

func tracing(t *testing.T) (*sdktrace.TracerProvider, ended) {
	c := make(ended, 64)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(c), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, c
}

// next waits for the next span named name that ends, keeping the others
// in seen.
func (c ended) next(t *testing.T, name string, seen map[trace.SpanID]sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	t.Helper()
	for {
		select {
		case s := <-c:
			seen[s.SpanContext().SpanID()] = s
			if s.Name() == name {
				return s
			}
		case <-time.After(teststores.Timeout):
			t.Fatalf("no %s span ended", name)
		}
	}
}

func attrOf(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

const (
	clientTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan   = "00f067aa0ba902b7"
	clientParent = "00-" + clientTrace + "-" + clientSpan + "-01"
)

func gatewayRules(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"rules": [
	  {"name": "free", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}}]}`)
	return path
}

func gwGetTraced(t *testing.T, base, traceparent string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/orders/7", nil)
	req.Header.Set("X-Api-Key", "client-7")
	if traceparent != "" {
		req.Header.Set("Traceparent", traceparent)
		req.Header.Set("Tracestate", "vendor=abc")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// With tracing on, the gateway continues the client's trace: its server
// span is a child of the client's, the engine's spans are children of
// it, and the upstream receives a traceparent of the same trace whose
// parent is drip's span.
func TestGatewayTrace(t *testing.T) {
	tp, spans := tracing(t)
	up := newUpstream(t)
	srv := start(t, Config{Rules: gatewayRules(t), Upstream: up.URL, WatchEvery: -1, TracerProvider: tp}, memstore.New())

	if resp := gwGetTraced(t, srv.base, clientParent); resp.StatusCode != 200 {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	seen := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	server := spans.next(t, "GET", seen)
	if server.SpanKind() != trace.SpanKindServer || server.Parent().TraceID().String() != clientTrace ||
		server.Parent().SpanID().String() != clientSpan || !server.Parent().IsRemote() {
		t.Fatalf("server span %s: parent %v", server.Name(), server.Parent())
	}
	if attrOf(server, "http.response.status_code").AsInt64() != 200 {
		t.Errorf("server span's status: %v", server.Attributes())
	}
	got := up.lastHeader()
	parts := strings.Split(got.Get("Traceparent"), "-")
	if len(parts) != 4 || parts[1] != clientTrace || parts[2] != server.SpanContext().SpanID().String() {
		t.Fatalf("upstream got traceparent %q, want trace %s and parent %s (drip's span)", got.Get("Traceparent"), clientTrace, server.SpanContext().SpanID())
	}
	if got.Get("Tracestate") != "vendor=abc" {
		t.Errorf("upstream got tracestate %q, want the client's", got.Get("Tracestate"))
	}
	var decide, store sdktrace.ReadOnlySpan
	for _, s := range seen {
		switch s.Name() {
		case engine.SpanDecide:
			decide = s
		case engine.SpanStore:
			store = s
		}
	}
	if decide == nil || store == nil {
		t.Fatalf("spans %v: want a decide and a store span", seen)
	}
	if decide.Parent().SpanID() != server.SpanContext().SpanID() || store.Parent().SpanID() != decide.SpanContext().SpanID() {
		t.Errorf("decide's parent %s, store's parent %s: want the server span, then decide", decide.Parent().SpanID(), store.Parent().SpanID())
	}

	// Denied: the span says 429 and the upstream is not called.
	hits := up.hits.Load()
	if resp := gwGetTraced(t, srv.base, clientParent); resp.StatusCode != 429 {
		t.Fatalf("second request: %d", resp.StatusCode)
	}
	server = spans.next(t, "GET", seen)
	if attrOf(server, "http.response.status_code").AsInt64() != 429 || up.hits.Load() != hits {
		t.Errorf("denied request's span: %v (upstream hits %d -> %d)", server.Attributes(), hits, up.hits.Load())
	}

	// No trace context: drip starts a trace, and the upstream joins it.
	up2 := newUpstream(t)
	srv2 := start(t, Config{Rules: gatewayRules(t), Upstream: up2.URL, WatchEvery: -1, TracerProvider: tp}, memstore.New())
	gwGetTraced(t, srv2.base, "")
	server = spans.next(t, "GET", seen)
	if server.Parent().IsValid() {
		t.Errorf("span without trace context has parent %v", server.Parent())
	}
	want := "00-" + server.SpanContext().TraceID().String() + "-" + server.SpanContext().SpanID().String() + "-01"
	if tp := up2.lastHeader().Get("Traceparent"); tp != want {
		t.Errorf("upstream got traceparent %q, want %q", tp, want)
	}
}

// With tracing off, the gateway passes the client's trace context
// through untouched and adds none.
func TestGatewayTraceOff(t *testing.T) {
	up := newUpstream(t)
	srv := start(t, Config{Rules: gatewayRules(t), Upstream: up.URL, WatchEvery: -1}, memstore.New())
	gwGetTraced(t, srv.base, clientParent)
	if h := up.lastHeader(); h.Get("Traceparent") != clientParent || h.Get("Tracestate") != "vendor=abc" {
		t.Errorf("upstream got traceparent %q, tracestate %q; want the client's", h.Get("Traceparent"), h.Get("Tracestate"))
	}
	up.mu.Lock()
	up.last = nil
	up.mu.Unlock()
	srv2 := start(t, Config{Rules: gatewayRules(t), Upstream: up.URL, WatchEvery: -1}, memstore.New())
	gwGetTraced(t, srv2.base, "")
	if h := up.lastHeader(); h == nil || h.Get("Traceparent") != "" || h.Get("Tracestate") != "" {
		t.Errorf("upstream got trace context %q %q from a client that sent none", h.Get("Traceparent"), h.Get("Tracestate"))
	}
}

// The decision API's requests are traced too: a server span per request,
// the store call its child.
func TestDecisionAPITrace(t *testing.T) {
	tp, spans := tracing(t)
	srv := start(t, Config{TracerProvider: tp}, memstore.New())
	req, _ := http.NewRequest("POST", srv.base+"/v1/take", strings.NewReader(`{"key": "client-7", `+lim+`}`))
	req.Header.Set("Traceparent", clientParent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	seen := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	server := spans.next(t, "POST /v1/take", seen)
	if server.Parent().SpanID().String() != clientSpan || attrOf(server, "http.response.status_code").AsInt64() != 200 || attrOf(server, "http.route").AsString() != "/v1/take" {
		t.Fatalf("server span: parent %v, attributes %v", server.Parent(), server.Attributes())
	}
	var store sdktrace.ReadOnlySpan
	for _, s := range seen {
		if s.Name() == engine.SpanStore {
			store = s
		}
	}
	if store == nil || store.Parent().SpanID() != server.SpanContext().SpanID() || attrOf(store, "drip.op").AsString() != "take" {
		t.Fatalf("store span %v", store)
	}
}

// Envoy's rate limit service: a server span per call, a child of the
// trace context in the call's metadata, with the store call under it.
func TestEnvoyTrace(t *testing.T) {
	tp, spans := tracing(t)
	dir := t.TempDir()
	envoyFile(t, filepath.Join(dir, "edge.yaml"), 5)
	srv := start(t, Config{Rules: dir, GRPCListen: "127.0.0.1:0", WatchEvery: -1, TracerProvider: tp}, memstore.New())
	c, _ := grpcClient(t, srv.Server)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", clientParent)
	if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "1.2.3.4"}}}}}); err != nil {
		t.Fatal(err)
	}
	seen := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	server := spans.next(t, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", seen)
	if server.Parent().SpanID().String() != clientSpan || server.Parent().TraceID().String() != clientTrace || server.SpanKind() != trace.SpanKindServer {
		t.Fatalf("server span's parent %v", server.Parent())
	}
	var store sdktrace.ReadOnlySpan
	for _, s := range seen {
		if s.Name() == engine.SpanStore {
			store = s
		}
	}
	if store == nil || store.Parent().SpanID() != server.SpanContext().SpanID() {
		t.Fatalf("store span %v, want a child of the call's span", store)
	}
}

// With tracing on, the gateway still streams: the upstream's flushes
// reach the client through the span's response writer.
func TestGatewayTraceStreams(t *testing.T) {
	tp, _ := tracing(t)
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "second\n")
	}))
	t.Cleanup(up.Close)
	srv := start(t, Config{Rules: gatewayRules(t), Upstream: up.URL, WatchEvery: -1, TracerProvider: tp}, memstore.New())
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the servers stop, should the test fail
	// Without the flush even the headers would wait for the upstream.
	ctx, cancel := context.WithTimeout(context.Background(), teststores.Timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.base+"/stream", nil)
	req.Header.Set("X-Api-Key", "client-7")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("the first line was not flushed: %v", err)
	}
	defer resp.Body.Close()
	lines := make(chan string, 2)
	go func() {
		br := bufio.NewReader(resp.Body)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				close(lines)
				return
			}
			lines <- l
		}
	}()
	for _, want := range []string{"first\n", "second\n"} {
		select {
		case l := <-lines:
			if l != want {
				t.Fatalf("read %q, want %q", l, want)
			}
		case <-time.After(teststores.Timeout):
			t.Fatalf("%q did not arrive before the upstream finished: the flush was lost", want)
		}
		if want == "first\n" {
			free()
		}
	}
}
