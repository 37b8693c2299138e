package server

import (
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/driplimit/drip/httplimit"
)

// Forward auth: GET /v1/forward-auth on the decision API's listener, for
// a reverse proxy that asks drip about each request before passing it on
// (nginx's auth_request, Caddy's reverse_proxy or forward_auth, Traefik's
// ForwardAuth). The proxy sends the original request's headers, and says
// what the request was:
//
//   - its method in X-Forwarded-Method (Traefik, Caddy) or
//     X-Original-Method (nginx configs set it);
//   - its request target ("/path?query") in X-Forwarded-Uri or
//     X-Original-URI;
//   - its host in X-Forwarded-Host (else the Host of the ask stands);
//   - the client in X-Forwarded-For, read as the gateway reads it
//     (httplimit.ClientIP under the rules' trusted_proxies).
//
// drip rebuilds the original request from them and decides it exactly as
// the gateway would (httplimit.Limiter.Decide: the same rules, keys,
// engine, metrics). Allowed: 200 with the RateLimit headers, no body.
// Denied: the gateway's answer, 429 (or 503 when the store fails and
// on_error is deny) with Retry-After, the RateLimit headers and the
// problem+json body; Caddy and Traefik pass it to the client as it is.
//
// The target and method are read as the gateway reads a request's
// (httplimit.Limiter.Decide): as application servers route them, so that
// "/admin;x=1/y" or "post" meets the rules on /admin/* and POST, and when
// a rule reads the path, one that servers read in different ways is
// refused as the gateway refuses it, 400 with the reason ambiguous_path.
//
// nginx's auth_request passes on only 2xx, 401 and 403, so the proxy may
// ask for another status: /v1/forward-auth?deny_status=403 (or 401)
// answers a denial (or that 400) with that status, the same headers and
// body, and two more headers for the proxy to rebuild the answer from:
// Drip-Status (429, 503 or 400) and Drip-Problem (the problem+json body
// on one line).
//
// The forwarding headers are believed only from a trusted proxy: a caller
// whose address is not in the rules' trusted_proxies gets 400, as does an
// ask without the method or the target, or with two different values of
// one (a client may add X-Original-URI to a request that Caddy forwards
// with its own X-Forwarded-Uri: rather than pick one, drip refuses), or
// with a method or target that is not valid (a target with '#' or '\' is
// not: apps read them differently, see originalRequest). Such a 400 is
// not a denial: nothing was taken.

// forwardAuthPath is where forward auth is served.
const forwardAuthPath = "/v1/forward-auth"

// Headers of a denial for a proxy that asked for deny_status.
const (
	hdrDripStatus  = "Drip-Status"
	hdrDripProblem = "Drip-Problem"
)

// forwardAuth answers a proxy's ask with the gateway's decision on the
// request it describes.
func (s *Server) forwardAuth(w http.ResponseWriter, r *http.Request) {
	deny := 0
	if v, ok := r.URL.Query()["deny_status"]; ok {
		if len(v) != 1 || (v[0] != "401" && v[0] != "403" && v[0] != "429") {
			writeError(w, inputf("deny_status: want 401, 403 or 429"))
			return
		}
		deny, _ = strconv.Atoi(v[0])
	}
	orig, err := originalRequest(r, s.lim.Rules().TrustedProxies)
	if err != nil {
		writeError(w, err)
		return
	}
	out := s.lim.Decide(r.Context(), orig)
	// The proxy never says when the response it guards ends, so forward
	// auth cannot hold an in-flight slot for it: a concurrency rule's
	// slot is given back as the ask is answered (it bounds the asks in
	// flight, not the requests). Holding it until its lease expired
	// instead would turn the rule into max_in_flight per lease_ttl. An
	// adaptive rule learns nothing here (Abandon): the ask's latency and
	// outcome tell nothing of the upstream's.
	defer out.Release(r.Context())
	out.Abandon()
	h := w.Header()
	httplimit.WriteHeaders(h, out)
	switch {
	case out.Allowed:
		w.WriteHeader(http.StatusOK)
	case deny != 0:
		h.Set(hdrDripStatus, strconv.Itoa(httplimit.Status(out)))
		h.Set(hdrDripProblem, string(httplimit.ProblemJSON(out)))
		httplimit.WriteErrorAs(w, out, deny)
	default:
		httplimit.WriteError(w, out)
	}
}

// originalRequest is the request a proxy asks about, as the gateway would
// have received it: the ask's headers and peer, with the method, target
// and host the proxy forwarded. Its body is empty (forward auth never
// reads the client's body, and the rules never read a body).
func originalRequest(r *http.Request, trusted []netip.Prefix) (*http.Request, error) {
	if !httplimit.FromTrustedProxy(r, trusted) {
		return nil, inputf("forward auth: the caller is not a trusted proxy: add the proxy's address to the rules' trusted_proxies")
	}
	method, err := forwarded(r.Header, "X-Forwarded-Method", "X-Original-Method")
	if err != nil {
		return nil, err
	}
	if !isToken(method) {
		return nil, inputf("forward auth: the forwarded method %q is not an HTTP method", method)
	}
	target, err := forwarded(r.Header, "X-Forwarded-Uri", "X-Original-URI")
	if err != nil {
		return nil, err
	}
	if i := strings.IndexAny(target, "#\\"); i >= 0 {
		// Neither is allowed in a request target, and servers disagree on
		// them: the app may stop the path at '#' (a fragment) or read '\'
		// as '/', where drip reads both as text ("/search#/../x" is "/x"
		// to drip, "/search" to such an app): a rule on the path could be
		// dodged. nginx and Caddy pass both on as the client sent them.
		return nil, inputf("forward auth: the forwarded request target has a %q, which a request target cannot hold", target[i])
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, inputf("forward auth: the forwarded request target is not valid: %v", err)
	}
	o := r.WithContext(r.Context()) // a shallow copy, headers shared (read only)
	o.Method, o.URL, o.RequestURI = method, u, target
	if hosts := r.Header.Values("X-Forwarded-Host"); len(hosts) == 1 {
		o.Host = hosts[0]
	}
	o.Body, o.ContentLength, o.TransferEncoding = http.NoBody, 0, nil
	return o, nil
}

// forwarded is the one value of the original request that a proxy sends
// under either of two header names: a 400 when neither is there, or when
// the lines under both disagree.
func forwarded(h http.Header, a, b string) (string, error) {
	vals := append(h.Values(a), h.Values(b)...)
	if len(vals) == 0 {
		return "", inputf("forward auth: no %s (or %s) header: the proxy must send the original request's", a, b)
	}
	for _, v := range vals[1:] {
		if v != vals[0] {
			return "", inputf("forward auth: %s and %s disagree: send one value", a, b)
		}
	}
	if vals[0] == "" {
		return "", inputf("forward auth: %s (or %s) is empty", a, b)
	}
	return vals[0], nil
}

// isToken reports whether s is an HTTP token (RFC 9110), as a method is.
func isToken(s string) bool {
	for _, c := range []byte(s) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return s != ""
}
