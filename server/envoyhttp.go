package server

import (
	"errors"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/driplimit/drip/internal/redact"
	"github.com/driplimit/drip/server/envoy"
)

// envoyproxy/ratelimit's two HTTP endpoints, on the admin listener, so
// that its health checks and JSON clients carry over.

// maxJSONRequest bounds the body of POST /json; the service bounds the
// descriptors and entries in it.
const maxJSONRequest = 1 << 20

// healthcheck answers as envoyproxy/ratelimit's /healthcheck: 200 "OK"
// while the store answers within the store deadline, else 500; 500 while
// the server drains, as envoyproxy/ratelimit fails it on SIGTERM.
func (s *Server) healthcheck(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if s.draining.Load() {
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, "draining\n")
		return
	}
	if s.cfg.HealthNeedsConfig && s.xds != nil && !s.xdsLoaded.Load() { // xds.go
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, "no configuration loaded yet\n")
		return
	}
	if err := s.pingStore(r); err != nil && s.needsStore() != "" { // as /readyz (admin.go)
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, "store unreachable\n")
		return
	}
	io.WriteString(w, "OK\n")
}

// envoyJSON is envoyproxy/ratelimit's /json: a RateLimitRequest in
// protobuf's JSON form in, the RateLimitResponse in the same form out,
// decided by the same service as gRPC's ShouldRateLimit. 200 when the
// request is OK, 429 when it is over the limit, 400 for a request that is
// not valid, 413 for a body over 1 MiB, 503 when the store fails (its
// status in the body). The service is made here, in New, before anything
// is served.
func (s *Server) envoyJSON() http.Handler {
	svc := s.envoyService()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.xds != nil && !s.xdsLoaded.Load() { // xds.go: as ShouldRateLimit answers
			http.Error(w, "no rate limit configuration loaded yet (waiting for the xDS server)", http.StatusServiceUnavailable)
			return
		}
		envoyJSON(svc, w, r)
	})
}

func envoyJSON(svc *envoy.Service, w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r, maxJSONRequest, nil)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": "request body over 1 MiB"})
			return
		}
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "reading the request: " + err.Error()})
		return
	}
	if err := envoy.JSONBounds(body); err != nil { // before protojson, which would hold them all
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "not a RateLimitRequest in JSON: " + err.Error()})
		return
	}
	resp, err := svc.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		code := http.StatusServiceUnavailable
		if status.Code(err) == codes.InvalidArgument {
			code = http.StatusBadRequest
		}
		writeJSON(w, code, map[string]string{"error": redact.Text(status.Convert(err).Message())})
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}
