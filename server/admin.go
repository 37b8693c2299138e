package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/redact"
	"github.com/driplimit/drip/rules"
)

// The admin listener:
//   GET  /metrics          Prometheus metrics (no token)
//   GET  /healthz          200 while the process serves (no token)
//   GET  /readyz           200 if the store answers a peek within the store deadline, or if
//                          it does not but every request served can still be decided
//                          without it (storeless), else 503; 503 while the server drains
//                          (drain.go) (no token)
//   GET  /healthcheck      envoyproxy/ratelimit's health check: 200 "OK" when /readyz is 200, else 500 (no token)
//   POST /json             envoyproxy/ratelimit's JSON form of ShouldRateLimit (no token; envoyhttp.go);
//                          404 when the gRPC listener requires client certificates
//   GET  /v1/admin/bucket?rule=NAME&value=V[&value=V2...]
//   GET  /v1/admin/bucket?rule=NAME&key=KEY
//                          inspect a bucket: a peek of cost 0, which changes nothing;
//                          its tokens are the bucket's content now
//   POST /v1/admin/reset   {"rule": NAME, "values": [...]} or {"key": KEY}: the bucket is full again
//   POST /v1/admin/reload  reload the rules file now
//   GET  /v1/admin/rules   the rules in force
//   PUT, DELETE /v1/admin/overrides/{rule}[/{value}], GET /v1/admin/overrides
//                          per-tenant limits (overrides.go)
//   GET  /v1/admin/top     who is being limited (who.go)
//   POST /v1/admin/tenant  a tenant's whole picture (tenant.go)
//   GET  /ui/              the admin page (ui.go): its files need no token, its data does
// The /v1/admin/ endpoints answer 401 without "Authorization: Bearer
// <token>", and 404 when the server has no admin token.

// readyKey is the bucket /readyz peeks at.
const readyKey = "drip:readyz"

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.ready)
	mux.HandleFunc("GET /healthcheck", s.healthcheck)
	if s.cfg.ClientCertsRequired() {
		// This listener asks for no certificate: deciding here would
		// let any client spend the limits that mutual TLS guards.
		mux.HandleFunc("POST /json", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "POST /json is not served here: the gRPC listener requires client certificates (mutual TLS), and decisions are made there only"})
		})
	} else {
		mux.Handle("POST /json", s.envoyJSON())
	}
	mux.Handle("GET /v1/admin/bucket", s.auth(http.HandlerFunc(s.inspect)))
	mux.Handle("POST /v1/admin/reset", s.auth(http.HandlerFunc(s.adminReset)))
	mux.Handle("POST /v1/admin/reload", s.auth(http.HandlerFunc(s.adminReload)))
	mux.Handle("GET /v1/admin/rules", s.auth(http.HandlerFunc(s.adminRules)))
	for _, p := range []string{"/v1/admin/overrides/{rule}", "/v1/admin/overrides/{rule}/{value}"} { // overrides.go
		mux.Handle("PUT "+p, s.auth(http.HandlerFunc(s.putOverride)))
		mux.Handle("DELETE "+p, s.auth(http.HandlerFunc(s.deleteOverride)))
	}
	mux.Handle("GET /v1/admin/overrides", s.auth(http.HandlerFunc(s.listOverrides)))
	mux.Handle("GET /v1/admin/top", s.auth(http.HandlerFunc(s.adminTop)))        // who.go
	mux.Handle("POST /v1/admin/tenant", s.auth(http.HandlerFunc(s.adminTenant))) // tenant.go
	mux.Handle("GET /ui/", s.uiHandler())                                        // ui.go
	mux.Handle("/v1/admin/", s.auth(http.NotFoundHandler()))
	return mux
}

// auth guards the admin API with the bearer token.
func (s *Server) auth(next http.Handler) http.Handler {
	token := []byte(s.cfg.AdminToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(token) == 0 {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "the admin API is off: start drip serve with --admin-token"})
			return
		}
		// One Authorization header (two are refused, not read first-wins),
		// its scheme matched without regard to case, as HTTP says.
		auth := r.Header.Values("Authorization")
		scheme, got, ok := "", "", len(auth) == 1
		if ok {
			scheme, got, ok = strings.Cut(auth[0], " ")
		}
		if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(got), token) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="drip admin"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong admin token"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// pingStore peeks at readyKey within the store deadline.
func (s *Server) pingStore(r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StoreTimeout)
	defer cancel()
	_, err := drip.Apply(ctx, s.store, bucket.Peek, timeZero, drip.Request{Key: readyKey, Limit: drip.PerSecond(1), Cost: 1})
	return err
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "draining"})
		return
	}
	if err := s.pingStore(r); err != nil {
		msg := redact.Text(err.Error())
		if why := s.needsStore(); why != "" {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "store unreachable", "error": msg, "reason": why})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready", "store": "unreachable", "error": msg,
			"deciding": "by each rule's on_error (allow or local) until the store answers"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// needsStore says why the server cannot serve without its store, or ""
// when it can: readiness follows what the instance can still decide.
// Without the store, the decision API and Envoy's rate limit service
// answer errors (503, UNAVAILABLE: their callers choose how to fail),
// and so does a rule that fails closed (on_error deny); enforced rules
// that fail open (allow) or decide locally (local) still serve, and
// shadow rules never change an answer.
func (s *Server) needsStore() string {
	switch {
	case s.cfg.GRPCListen != "" || s.cfg.XDS != nil:
		return "Envoy's rate limit service answers UNAVAILABLE without its store"
	case s.cfg.Listen != "off" && s.cfg.Upstream == "":
		return "the decision API answers 503 without its store"
	}
	for _, ru := range s.rules().Rules {
		if ru.Mode == rules.Enforce && ru.OnError == rules.Deny {
			return "rule " + strconv.Quote(ru.Name) + " fails closed without its store (on_error: deny)"
		}
	}
	return ""
}

// inspection is the admin API's view of one bucket.
type inspection struct {
	Rule     string        `json:"rule"`
	Key      string        `json:"key"`
	Limit    drip.Limit    `json:"limit"`
	Decision drip.Decision `json:"decision"`
}

func (s *Server) inspect(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name := q.Get("rule")
	if name == "" {
		writeError(w, inputf("give rule=NAME and value=... (one per limit key), or rule=NAME and key=KEY"))
		return
	}
	var req drip.Request
	var err error
	if key := q.Get("key"); key != "" {
		if q.Has("value") {
			writeError(w, inputf("give value or key, not both"))
			return
		}
		ru, err := s.rule(name)
		if err != nil {
			writeError(w, err)
			return
		}
		l, _ := s.eng.LimitOf(ru, key, nil) // the key's override, if any
		req = drip.Request{Key: key, Limit: l}
		req.Cost = 0 // the bucket as it is: tokens is its content now
	} else {
		vals, _ := json.Marshal(q["value"])
		if !q.Has("value") {
			vals = nil
		}
		req, _, err = s.ruleRequest(name, vals)
		if err != nil {
			writeError(w, err)
			return
		}
		req.Cost = 0 // the bucket as it is: tokens is its content now
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StoreTimeout)
	defer cancel()
	m, err := drip.Apply(ctx, s.store, bucket.Peek, timeZero, req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, inspection{Rule: name, Key: req.Key, Limit: req.Limit, Decision: m.Decisions[0]})
}

func (s *Server) adminReset(w http.ResponseWriter, r *http.Request) {
	b, err := decode(w, r)
	if err == nil && b.Requests != nil {
		err = inputf(`bad JSON: json: unknown field "requests"`)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	it, key := b.ReqJSON, ""
	switch rule := ruleOf(it); {
	case rule != "" && it.Key == "":
		req, _, err := s.ruleRequest(rule, it.Values)
		if err != nil {
			writeError(w, err)
			return
		}
		key = req.Key
	case rule == "" && it.Key != "" && it.Values == nil:
		key = it.Key
	default:
		writeError(w, inputf(`give {"rule": NAME, "values": [...]} or {"key": KEY}`))
		return
	}
	if it.Limit != nil || it.Cost != nil || it.Reserve {
		writeError(w, inputf("a reset takes only rule and values, or key"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StoreTimeout)
	defer cancel()
	if err := s.store.Reset(ctx, key); err != nil {
		writeError(w, err)
		return
	}
	s.log.Info("drip serve: bucket reset by the admin API", "key", key)
	writeJSON(w, http.StatusOK, map[string]any{"reset": true, "key": key})
}

func (s *Server) adminReload(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Rules == "" {
		writeJSON(w, http.StatusOK, map[string]any{"reloaded": false, "reason": "the built-in rules are in force: there is no file to reload"})
		return
	}
	if err := s.Reload(); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"reloaded": false, "error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"reloaded": true})
}
