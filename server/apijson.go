package server

import (
	"math"
	"net/http"
	"strconv"
	"sync"

	"github.com/driplimit/drip"
)

// writeDecision writes a decision API answer of one decision: the bytes
// writeJSON writes for it (encoding/json's, through Decision.MarshalJSON),
// appended by hand into a pooled buffer. A decision is the answer of
// nearly every call, and its reflection, the encoder and the copy it
// validates were most of the answer's encoding in the decision API's
// profile (TestWriteDecision holds the bytes to encoding/json's).
func writeDecision(w http.ResponseWriter, d drip.Decision) {
	bp := decisionBufs.Get().(*[]byte)
	b, ok := appendDecision((*bp)[:0], d)
	if !ok { // a value JSON cannot hold: encoding/json's error path
		writeJSON(w, http.StatusOK, d)
	} else {
		w.Header()["Content-Type"] = jsonContentType
		w.WriteHeader(http.StatusOK)
		w.Write(b)
	}
	*bp = b
	decisionBufs.Put(bp)
}

// jsonContentType is the header's value, shared by every answer (net/http
// only reads it): Header.Set would allocate it each time.
var jsonContentType = []string{"application/json"}

var decisionBufs = sync.Pool{New: func() any { b := make([]byte, 0, 160); return &b }}

// appendDecision appends d as json.NewEncoder's Encode writes it (a
// newline after), or reports false for a value it would refuse (NaN or
// an infinity).
func appendDecision(b []byte, d drip.Decision) ([]byte, bool) {
	ok := true
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = append(b, `,"tokens":`...)
	b, ok = appendFloat(b, d.Tokens, ok)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = append(b, `,"limit":`...)
	b, ok = appendFloat(b, d.Burst, ok)
	b = append(b, `,"retry_after":`...)
	b, ok = appendFloat(b, d.RetryAfter.Seconds(), ok)
	b = append(b, `,"reset_after":`...)
	b, ok = appendFloat(b, d.ResetAfter.Seconds(), ok)
	return append(b, "}\n"...), ok
}

// appendFloat appends f as encoding/json writes a float64: the shortest
// decimal that reads back as f, in exponent form below 1e-6 and from 1e21
// on, with a one-digit negative exponent unpadded.
func appendFloat(b []byte, f float64, ok bool) ([]byte, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, ok
}
