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
		// Not the body again: net/http closes it once the response
		// begins, and a read then fails rather than ending, which made
		// http.Transport (it reads once past Content-Length) drop the
		// upstream connection mid-answer.
		return 0, io.EOF
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

// writeStallCut gives every write of a response a deadline of idle from
// the moment it starts: a client that stops reading for that long (its
// receive window full) has its connection closed, which frees the
// request's goroutines and its upstream connection, while a long download
// that keeps moving is never cut. The deadline is set as the handler
// starts, on every WriteHeader, Write and Flush, and once more as it
// returns, for the server's final flush; before that, a deadline left by
// an earlier request on the connection could cut this one. A blocked
// write resumes only once the kernel's send buffer has room for a good
// part of itself, so "moving" means the client reads about half a send
// buffer (a few MiB at most) within idle.
func writeStallCut(next http.Handler, idle time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w), idle: idle}
		_ = sw.extend()
		next.ServeHTTP(sw, r)
		_ = sw.extend()
	})
}

// stallWriter is writeStallCut's ResponseWriter. Unwrap lets
// http.ResponseController (and so httputil.ReverseProxy's flushing) reach
// the connection's own writer.
type stallWriter struct {
	http.ResponseWriter
	rc   *http.ResponseController
	idle time.Duration
}

func (w *stallWriter) extend() error {
	if err := w.rc.SetWriteDeadline(time.Now().Add(w.idle)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

func (w *stallWriter) WriteHeader(code int) {
	_ = w.extend()
	w.ResponseWriter.WriteHeader(code)
}

func (w *stallWriter) Write(p []byte) (int, error) {
	if err := w.extend(); err != nil {
		return 0, err
	}
	return w.ResponseWriter.Write(p)
}

// FlushError is what http.ResponseController.Flush calls.
func (w *stallWriter) FlushError() error {
	if err := w.extend(); err != nil {
		return err
	}
	return w.rc.Flush()
}

func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
