package main

import (
	"bytes"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

func TestTraceEnv(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want traceSettings
		err  string
	}{
		{env: nil, want: traceSettings{}},
		{env: map[string]string{"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, want: traceSettings{}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, want: traceSettings{On: true, Protocol: "http/protobuf"}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, want: traceSettings{On: true, Protocol: "http/protobuf"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: traceSettings{On: true, Protocol: "http/protobuf"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": " OTLP "}, want: traceSettings{On: true, Protocol: "http/protobuf"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: traceSettings{On: true, Protocol: "grpc"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, want: traceSettings{On: true, Protocol: "http/protobuf"}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, want: traceSettings{On: true, Protocol: "grpc"}},
		// Off whatever else says on.
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, want: traceSettings{}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, want: traceSettings{}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, want: traceSettings{}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "false"}, want: traceSettings{On: true, Protocol: "http/protobuf"}},
		// Errors: what drip cannot do is said, not ignored.
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: `OTEL_TRACES_EXPORTER="zipkin"`},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp,console"}, err: "otlp only"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, err: `OTEL_EXPORTER_OTLP_PROTOCOL="http/json": want grpc or http/protobuf`},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"}, err: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
		// A bad protocol does not matter while tracing is off.
		{env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}, want: traceSettings{}},
	} {
		got, err := traceEnv(func(k string) string { return tc.env[k] })
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want %q", tc.env, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: %+v, %v; want %+v", tc.env, got, err, tc.want)
		}
	}
}

// collector is an OTLP/HTTP trace receiver: it keeps what it is sent.
type collector struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*coltrace.ExportTraceServiceRequest
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.reqs = append(c.reqs, &req)
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Write(out)
	}))
	t.Cleanup(c.Close)
	return c
}

// drip serve with an OTLP endpoint in its environment exports its spans,
// under the service name drip, in the caller's trace; the spans still
// batched when it shuts down are flushed then.
func TestServeTracing(t *testing.T) {
	col := newCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000") // nothing exported before the shutdown
	api, _, stop := serveInProcess(t, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	req, _ := http.NewRequest("POST", "http://"+api+"/v1/take", strings.NewReader(`{"key": "k", "limit": {"rate": 1, "period": "1s"}}`))
	req.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code := stop(); code != 0 {
		t.Fatalf("drip serve exited with %d", code)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	names := map[string]bool{}
	for _, r := range col.reqs {
		for _, rs := range r.ResourceSpans {
			var service string
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					service = kv.GetValue().GetStringValue()
				}
			}
			if service != "drip" {
				t.Errorf("service.name %q, want drip", service)
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					names[s.Name] = true
					if !bytes.Equal(s.TraceId, mustHex(t, "4bf92f3577b34da6a3ce929d0e0e4736")) {
						t.Errorf("span %s in trace %x, want the caller's", s.Name, s.TraceId)
					}
				}
			}
		}
	}
	if !names["POST /v1/take"] || !names["drip.store"] {
		t.Fatalf("exported spans %v, want POST /v1/take and drip.store", names)
	}
}

func mustHex(t *testing.T, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestServeTracingBadEnv(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "jaeger")
	var out, errs bytes.Buffer
	code := run(t.Context(), []string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, strings.NewReader(""), &out, &errs)
	if code != 2 || !strings.Contains(errs.String(), `OTEL_TRACES_EXPORTER="jaeger"`) {
		t.Fatalf("exit %d, stderr %q", code, errs.String())
	}
}
