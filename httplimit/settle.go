package httplimit

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/llm"
	"github.com/driplimit/drip/rules"
)

// settleWriter watches a response for the rules that settle when it ends
// (cost_from_response, count_status): its status, its headers as they
// were sent, and its trailers.
type settleWriter struct {
	http.ResponseWriter
	status  int
	sent    http.Header // the headers when the status was written
	errored bool
	// usage: a rule reads the usage a model server reports in the body
	// (cost_from_response: openai or anthropic); scan reads the body as
	// it is written, never keeping it.
	usage bool
	scan  *llm.Scanner
	// req is the request's body as the API of a rule that prices its
	// usage read it (its model), read before it is served.
	req llm.Request
}

func (w *settleWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
		w.sent = w.ResponseWriter.Header().Clone()
		if w.usage {
			w.scan = llm.NewScanner(w.sent.Get("Content-Type"), w.sent.Get("Content-Encoding"))
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *settleWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(b)
	if w.scan != nil {
		w.scan.Write(b[:n])
	}
	return n, err
}

// Flush, Hijack and Unwrap keep what the writer underneath can do: a
// reverse proxy flushes a streamed response as it goes.
func (w *settleWriter) Flush() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *settleWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *settleWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// response is what was read of the response when the handler returned.
func (w *settleWriter) response() engine.Response {
	if w.errored || w.status == 0 {
		return engine.Response{}
	}
	return engine.Response{Status: w.status, Value: func(src rules.ResponseSource) (string, bool) {
		if src.API != "" {
			api, part, _ := llm.ParseName(src.API)
			if part == llm.Money {
				n, ok := w.scan.Money(api, w.req, src.Prices)
				return strconv.FormatInt(n, 10), ok
			}
			n, ok := w.scan.Tokens(api, part)
			return strconv.FormatInt(n, 10), ok
		}
		if !src.Trailer {
			v := w.sent.Get(src.Name)
			return v, v != ""
		}
		h := w.ResponseWriter.Header()
		// A trailer is set after the body: under its own name when it
		// was announced (the Trailer header), else with TrailerPrefix.
		if v := h.Get(http.TrailerPrefix + src.Name); v != "" {
			return v, true
		}
		for _, t := range w.sent.Values("Trailer") {
			for n := range strings.SplitSeq(t, ",") {
				if strings.EqualFold(strings.TrimSpace(n), src.Name) {
					v := h.Get(src.Name)
					return v, v != ""
				}
			}
		}
		return "", false
	}}
}

// Errored tells the middleware that the request failed without being
// served, such as a gateway's unreachable upstream. The estimates of
// its cost_from_response rules are refunded. No count_status rule counts
// it, whatever the handler then writes. It does nothing for a writer the
// middleware did not wrap.
func Errored(w http.ResponseWriter) {
	for {
		if sw, ok := w.(*settleWriter); ok {
			sw.errored = true
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// serveSettled runs next with a writer that watches its response, and
// settles out's rules when it has ended, however it ended: returned, a
// panic (the panic goes on), a client gone.
func serveSettled(w http.ResponseWriter, r *http.Request, next http.Handler, out *engine.Outcome) {
	sw := &settleWriter{ResponseWriter: w, usage: out.ReadsUsage()}
	if sw.usage {
		askUsage(r, out) // llm.go
		sw.req = pricedRequest(r, out)
	}
	if sw.usage && r.Header.Get("Accept-Encoding") != "" {
		// The usage is read in the body as it goes by: ask for it
		// uncompressed.
		r = r.Clone(r.Context())
		r.Header.Del("Accept-Encoding")
	}
	defer func() {
		p := recover()
		switch {
		case sw.status != 0:
		case p == nil:
			// It wrote nothing: net/http answers 200 with its headers.
			sw.status, sw.sent = http.StatusOK, w.Header().Clone()
		case !errors.Is(asError(p), http.ErrAbortHandler):
			sw.errored = true // failed before it served anything
		}
		_ = out.Settle(context.WithoutCancel(r.Context()), sw.response())
		if p != nil {
			panic(p)
		}
	}()
	next.ServeHTTP(sw, r)
}

func asError(p any) error {
	if err, ok := p.(error); ok {
		return err
	}
	return nil
}
