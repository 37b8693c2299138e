package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/driplimit/drip/engine"

	"github.com/driplimit/drip/store/memstore"
)

// TestHandler: a user's burst of 10, then 429; another user and an
// anonymous client have buckets of their own.
func TestHandler(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	// Time stands still: no token comes back however slow the machine.
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h, err := newHandler(store, engine.WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	get := func(auth string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/hello", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for i := range 10 {
		if rec := get("Bearer ann"); rec.Code != 200 || rec.Body.String() != "hello ann\n" || rec.Header().Get("RateLimit-Policy") != `"per-user";q=10;w=2` {
			t.Fatalf("request %d: %d %v %q", i, rec.Code, rec.Header(), rec.Body)
		}
	}
	if rec := get("Bearer ann"); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("11th request: %d %v", rec.Code, rec.Header())
	}
	if rec := get("Bearer bob"); rec.Code != 200 {
		t.Errorf("bob: %d", rec.Code)
	}
	for i := range 5 {
		if rec := get(""); rec.Code != 200 || rec.Header().Get("RateLimit-Policy") != `"anonymous";q=5;w=5` {
			t.Fatalf("anonymous %d: %d %v", i, rec.Code, rec.Header())
		}
	}
	if rec := get(""); rec.Code != http.StatusTooManyRequests {
		t.Errorf("6th anonymous request: %d", rec.Code)
	}
}
