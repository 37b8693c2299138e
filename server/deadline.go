package server

import (
	"errors"
	"io"
	"net/http"
	"time"
)

// stallCut gives every read of a request body a deadline of idle from
// the moment it starts: a body that stops arriving for that long fails
// with a timeout, which ends the request and its connection, while a long
// upload that keeps moving is never cut. Once the whole body has been
// read the deadline is lifted, so that a slow upstream answer does not
// trip it.
func stallCut(next http.Handler, idle time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &stallBody{ReadCloser: r.Body, rc: http.NewResponseController(w), idle: idle}
		}
		next.ServeHTTP(w, r)
	})
}

type stallBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
	done bool
}

func (b *stallBody) Read(p []byte) (int, error) {
	if b.done {
		return b.ReadCloser.Read(p)
	}
	if err := b.rc.SetReadDeadline(time.Now().Add(b.idle)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return 0, err
	}
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		// The whole body is in: lift the deadline. After any other error
		// it stays, so that the server, draining the rest of the body to
		// reuse the connection, gives up too and closes it.
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
