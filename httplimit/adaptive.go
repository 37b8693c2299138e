package httplimit

import (
	"context"
	"errors"
	"net/http"

	"github.com/driplimit/drip/engine"
)

// dropWriter watches the status of a response whose request holds a
// slot of an adaptive rule, which learns from it (engine.Outcome.Drop).
type dropWriter struct {
	http.ResponseWriter
	status int
}

func (w *dropWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *dropWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *dropWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *dropWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// watchDrops wraps w for out's adaptive rules, and returns the writer
// and what to call when the handler has returned (ended: normally, not
// by a panic): a response of their drop_status, a request whose
// deadline passed, or a handler that panicked tells them of an
// overloaded upstream. A request whose client went away (its context
// cancelled) tells them nothing, whatever the handler answered (a
// proxy's 502 for the upstream call it cut): they learn nothing from it
// (engine.Outcome.Abandon).
func watchDrops(w http.ResponseWriter, r *http.Request, out *engine.Outcome) (http.ResponseWriter, func(ended bool)) {
	dw := &dropWriter{ResponseWriter: w}
	return dw, func(ended bool) {
		status := dw.status
		if status == 0 && ended {
			status = http.StatusOK
		}
		switch err := r.Context().Err(); {
		case !ended || errors.Is(err, context.DeadlineExceeded):
			out.Drop()
		case errors.Is(err, context.Canceled):
			out.Abandon()
		case out.Drops(status):
			out.Drop()
		}
	}
}
