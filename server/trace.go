package server

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
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
// Only the method and the status are recorded: paths and addresses may
// name clients.
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
		h.ServeHTTP(sw, r.WithContext(ctx))
		if sw.code == 0 {
			sw.code = http.StatusOK
		}
		sp.SetAttributes(attribute.Int("http.response.status_code", sw.code))
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
