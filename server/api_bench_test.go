package server

import (
	"bytes"
	"fmt"
	"io"
	"net/http/httptest"
	"testing"

	"github.com/driplimit/drip/store/memstore"
)

// BenchmarkTakeHandler is one inline take through the decision API's
// handler (read, decode, decide, answer) on the memory store, without the
// network: what drip serve adds to net/http for the common request.
//
//	go test -run '^$' -bench TakeHandler -benchmem ./server/
func BenchmarkTakeHandler(b *testing.B) {
	s, err := New(Config{AdminListen: "off"}, memstore.New())
	if err != nil {
		b.Fatal(err)
	}
	h := s.decideHandler("take")
	const keys = 1000
	bodies := make([][]byte, keys)
	for i := range bodies {
		bodies[i] = fmt.Appendf(nil, `{"key": "user:%d", "limit": {"rate": 1000000, "burst": 1000000}}`, i)
	}
	r := httptest.NewRequest("POST", "/v1/take", nil)
	rd := new(bytes.Reader)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		rd.Reset(bodies[i%keys])
		r.Body, r.ContentLength = io.NopCloser(rd), int64(rd.Len())
		w.Body.Reset()
		h.ServeHTTP(w, r)
		if w.Code != 200 {
			b.Fatalf("%d %s", w.Code, w.Body)
		}
		i++
	}
}
