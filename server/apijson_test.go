package server

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/driplimit/drip"
)

// TestWriteDecision holds the hand-written answer to encoding/json's
// bytes for the same decision (what writeJSON wrote before), on edge
// values and on random ones.
func TestWriteDecision(t *testing.T) {
	ds := []drip.Decision{
		{},
		{Allowed: true, Tokens: 999999, Remaining: 999999, Burst: 1e6, ResetAfter: time.Microsecond},
		{Tokens: -2.5, Burst: 3, RetryAfter: 1500 * time.Millisecond, ResetAfter: time.Hour},
		{Tokens: 0.000001, Burst: 1e-7, RetryAfter: time.Nanosecond, ResetAfter: 999 * time.Nanosecond},
		{Tokens: 1e21, Remaining: math.MaxInt64, Burst: 1.5e300, RetryAfter: math.MaxInt64, ResetAfter: math.MinInt64},
		{Tokens: -1e-9, Remaining: -1, Burst: 123456789.123456, RetryAfter: -time.Second},
		{Tokens: 5e-324, Burst: math.MaxFloat64},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		f := func() float64 {
			switch rng.IntN(4) {
			case 0:
				return float64(rng.Int64N(1e12)) / 1e6
			case 1:
				return math.Float64frombits(rng.Uint64())
			case 2:
				return math.Ldexp(rng.Float64(), rng.IntN(160)-80)
			}
			return -rng.NormFloat64() * 1e6
		}
		ds = append(ds, drip.Decision{Allowed: rng.IntN(2) == 0, Tokens: f(), Remaining: rng.Int64(), Burst: f(),
			RetryAfter: time.Duration(rng.Int64()), ResetAfter: time.Duration(rng.Int64N(1e12))})
	}
	for _, d := range ds {
		want := httptest.NewRecorder()
		writeJSON(want, 200, d)
		got := httptest.NewRecorder()
		writeDecision(got, d)
		if !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) || got.Code != want.Code ||
			got.Header().Get("Content-Type") != want.Header().Get("Content-Type") {
			t.Fatalf("%+v:\n got %d %q %s\nwant %d %q %s", d, got.Code, got.Header().Get("Content-Type"), got.Body.Bytes(),
				want.Code, want.Header().Get("Content-Type"), want.Body.Bytes())
		}
		if math.IsNaN(d.Tokens) || math.IsInf(d.Tokens, 0) || math.IsNaN(d.Burst) || math.IsInf(d.Burst, 0) {
			continue
		}
		var back drip.Decision
		if err := json.Unmarshal(got.Body.Bytes(), &back); err != nil {
			t.Fatalf("%s: %v", got.Body.Bytes(), err)
		}
	}
}

// BenchmarkWriteDecision is the answer's encoding alone, by hand beside
// writeJSON (encoding/json), into a recorder.
//
//	go test -run '^$' -bench WriteDecision -benchmem ./server/
func BenchmarkWriteDecision(b *testing.B) {
	d := drip.Decision{Allowed: true, Tokens: 999998.5, Remaining: 999998, Burst: 1e6, ResetAfter: 1500 * time.Nanosecond}
	for name, write := range map[string]func(w *httptest.ResponseRecorder){
		"hand":          func(w *httptest.ResponseRecorder) { writeDecision(w, d) },
		"encoding-json": func(w *httptest.ResponseRecorder) { writeJSON(w, 200, d) },
	} {
		b.Run(name, func(b *testing.B) {
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				w.Body.Reset()
				write(w)
			}
		})
	}
}
