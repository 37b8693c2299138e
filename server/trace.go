package server

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// tracerName is the instrumentation scope of the server's spans.
const tracerName = "github.com/driplimit/drip/server"

// traceContext reads and writes W3C trace context (traceparent,
// tracestate): the one propagation format drip speaks.
var traceContext = propagation.TraceContext{}

// traced wraps the front listener's handler in a server span per
// request, a child of the caller's span when the request carries W3C
// trace context. The engine's spans (drip.decide, drip.store) are its
// children, and the gateway passes it on to the upstream (injectTrace).
// Only the method, the status and the decision API's route are recorded:
// paths and addresses may name clients.
func (s *Server) traced(h http.Handler) http.Handler {
	tr := s.cfg.TracerProvider.Tracer(tracerName)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := traceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		method := knownMethod(r.Method)
		ctx, sp := tr.Start(ctx, method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", method)))
		defer sp.End()
		if !sp.IsRecording() {
			h.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		r = r.WithContext(ctx)
		h.ServeHTTP(sw, r)
		if sw.code == 0 {
			sw.code = http.StatusOK
		}
		sp.SetAttributes(attribute.Int("http.response.status_code", sw.code))
		// The decision API's routes are few and fixed (ServeMux's
		// pattern); the gateway's paths are the client's, and stay out.
		if p := r.Pattern; p != "" && p != "/" {
			sp.SetName(method + " " + p)
			sp.SetAttributes(attribute.String("http.route", p))
		}
		if sw.code >= 500 {
			sp.SetStatus(codes.Error, "")
		}
	})
}

// injectTrace writes the trace context of out's context (the gateway's
// server span) into its headers, replacing what the client sent, so the
// upstream's spans are children of drip's. Without tracing the gateway
// does not call it, and the client's traceparent and tracestate pass
// through untouched.
func injectTrace(out *http.Request) {
	traceContext.Inject(out.Context(), propagation.HeaderCarrier(out.Header))
}

// knownMethod is m if it is a standard HTTP method, else "_OTHER": a
// span name of bounded cardinality whatever a client sends.
func knownMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "_OTHER"
}

// statusWriter remembers the status of a response. Unwrap lets
// http.ResponseController (the reverse proxy's flushes and upgrades)
// reach the connection's writer.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && code >= 200 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// tracedGRPC gives each call of the gRPC listener (Envoy's
// ShouldRateLimit, health checks) a server span named by its method, a
// child of the W3C trace context in the call's metadata (Envoy's
// OpenTelemetry tracer sends it); the engine's store spans are its
// children. Only registered methods reach it: names are bounded.
func (s *Server) tracedGRPC() grpc.ServerOption {
	tr := s.cfg.TracerProvider.Tracer(tracerName)
	return grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		ctx = traceContext.Extract(ctx, mdCarrier(md))
		ctx, sp := tr.Start(ctx, strings.TrimPrefix(info.FullMethod, "/"), trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("rpc.system", "grpc")))
		defer sp.End()
		resp, err := h(ctx, req)
		code := status.Code(err)
		sp.SetAttributes(attribute.Int("rpc.grpc.status_code", int(code)))
		if err != nil {
			sp.SetStatus(codes.Error, code.String())
		}
		return resp, err
	})
}

// mdCarrier reads trace context from gRPC metadata (whose keys are lower
// case, as the propagator asks for them).
type mdCarrier metadata.MD

func (c mdCarrier) Get(k string) string {
	if v := metadata.MD(c).Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(k, v string) { metadata.MD(c).Set(k, v) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
