package server

import (
	"io"
	"net/http"
)

// readBody reads r's body of at most max bytes (else a
// *http.MaxBytesError). With a Content-Length, which net/http holds the
// body to, it allocates once, exactly that much, and refuses a length
// over max before reading a byte; io.ReadAll would grow its buffer by
// doubling, to up to twice the body. A chunked body, whose length is not
// known, is read with io.ReadAll, still bounded by max. A body that fits
// in buf's capacity is read into buf.
func readBody(w http.ResponseWriter, r *http.Request, max int64, buf []byte) ([]byte, error) {
	if r.ContentLength < 0 {
		return io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	}
	if r.ContentLength > max {
		http.MaxBytesReader(w, r.Body, max).Close() // the connection is not reused: the body is left unread
		return nil, &http.MaxBytesError{Limit: max}
	}
	// Up to Content-Length, at most max: r.Body as it is (net/http holds
	// it to its length), without a MaxBytesReader's allocation.
	body := r.Body
	b := buf[:0]
	if int64(cap(buf)) < r.ContentLength {
		b = make([]byte, r.ContentLength)
	}
	b = b[:r.ContentLength]
	if _, err := io.ReadFull(body, b); err != nil {
		return nil, err
	}
	return b, nil
}
