package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/store/memstore"
)

func TestRouter(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	// Time stands still: no token comes back however slow the machine.
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h, err := newRouter(store, engine.WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	get := func(path, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", path, nil)
		if key != "" {
			req.Header.Set("X-Api-Key", key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for i := range 10 {
		if rec := get("/hello", "k1"); rec.Code != 200 || rec.Header().Get("RateLimit-Policy") != `"per-api-key";q=10;w=60` {
			t.Fatalf("request %d: %d %v", i, rec.Code, rec.Header())
		}
	}
	if rec := get("/hello", "k1"); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("11th request: %d %v", rec.Code, rec.Header())
	}
	if rec := get("/hello", "k2"); rec.Code != 200 {
		t.Errorf("k2: %d", rec.Code)
	}
	if rec := get("/hello", ""); rec.Code != http.StatusUnauthorized || rec.Body.String() != errNoKey.Error()+"\n" {
		t.Errorf("no key: %d %q", rec.Code, rec.Body)
	}
	if rec := get("/health", ""); rec.Code != 200 || rec.Header().Get("RateLimit-Policy") != "" {
		t.Errorf("/health: %d %v", rec.Code, rec.Header())
	}
}
