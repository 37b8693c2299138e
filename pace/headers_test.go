package pace

import (
	"net/http"
	"slices"
	"testing"
	"time"
)

func TestParseReport(t *testing.T) {
	date := "Sat, 01 Jan 2000 00:00:00 GMT"
	server := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC) // what Date says
	skewed := server.Add(-time.Hour)                      // a client clock an hour behind, with no Date
	for _, tc := range []struct {
		name string
		hdr  []string
		at   time.Time // the client's now
		want []report
	}{
		{"drip's structured fields", []string{"RateLimit", `"free";r=7;t=2`, "RateLimit-Policy", `"free";q=20;w=2`},
			server, []report{{name: "free", remaining: 7, reset: 2 * time.Second, hasReset: true, limit: 20}}},
		{"several policies, each with its quota", []string{"RateLimit", `"a";r=7;t=2, b;r=3;t=9`, "RateLimit-Policy", `"b";q=50;w=60, "a";q=20;w=2`},
			server, []report{{name: "a", remaining: 7, reset: 2 * time.Second, hasReset: true, limit: 20}, {name: "b", remaining: 3, reset: 9 * time.Second, hasReset: true, limit: 50}}},
		{"a policy of unknown quota", []string{"RateLimit", `"a";r=1;t=1`, "RateLimit-Policy", `"x";q=20`},
			server, []report{{name: "a", remaining: 1, reset: time.Second, hasReset: true}}},
		{"a quota of concurrent requests", []string{"RateLimit", `"slots";r=0, "rate";r=5;t=9`, "RateLimit-Policy", `"slots";q=3;qu="concurrent-requests", "rate";q=9;qu="requests";w=9`},
			server, []report{{name: "slots", remaining: 0, limit: 3, concurrent: true}, {name: "rate", remaining: 5, reset: 9 * time.Second, hasReset: true, limit: 9}}},
		{"RateLimit without t", []string{"RateLimit", `"a";r=4`},
			server, []report{{name: "a", remaining: 4}}},
		{"at most 8 policies", []string{"RateLimit", `a;r=1, b;r=1, c;r=1, d;r=1, e;r=1, f;r=1, g;r=1, h;r=1, i;r=0`},
			server, []report{{name: "a", remaining: 1}, {name: "b", remaining: 1}, {name: "c", remaining: 1}, {name: "d", remaining: 1}, {name: "e", remaining: 1}, {name: "f", remaining: 1}, {name: "g", remaining: 1}, {name: "h", remaining: 1}}},
		{"a bad structured field falls back to the triple", []string{"RateLimit", `free;r=`, "RateLimit-Remaining", "5", "RateLimit-Limit", "10, 10;w=1", "RateLimit-Reset", "3"},
			server, []report{{remaining: 5, reset: 3 * time.Second, hasReset: true, limit: 10}}},
		{"GitHub: a Unix time, measured from Date", []string{"Date", date, "X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4999", "X-RateLimit-Reset", "946684860"},
			skewed, []report{{remaining: 4999, reset: time.Minute, hasReset: true, limit: 5000}}},
		{"GitHub names the resource", []string{"X-RateLimit-Resource", "search", "X-RateLimit-Limit", "30", "X-RateLimit-Remaining", "29", "X-RateLimit-Reset", "946684860", "Date", date},
			server, []report{{name: "search", remaining: 29, reset: time.Minute, hasReset: true, limit: 30}}},
		{"a Unix time without Date: the client's clock", []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "946684860"},
			skewed, []report{{remaining: 0, reset: time.Hour + time.Minute, hasReset: true}}},
		{"a Unix time in milliseconds", []string{"X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "946684801500"},
			server, []report{{remaining: 1, reset: 1500 * time.Millisecond, hasReset: true}}},
		{"a Unix time in the past: now", []string{"X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "946684000"},
			server, []report{{remaining: 1, reset: 0, hasReset: true}}},
		{"a delay with a fraction", []string{"X-RateLimit-Remaining", "2.9", "X-RateLimit-Reset", "0.25"},
			server, []report{{remaining: 2, reset: 250 * time.Millisecond, hasReset: true}}},
		{"a delay of 99,999,999 s is a delay (bounded)", []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "99999999"},
			server, []report{{remaining: 0, reset: maxDelay, hasReset: true}}},
		{"a bad reset is no reset", []string{"X-RateLimit-Remaining", "3", "X-RateLimit-Reset", "soon"},
			server, []report{{remaining: 3}}},
		{"a negative remaining is no report", []string{"X-RateLimit-Remaining", "-1"}, server, nil},
		{"NaN is no report", []string{"RateLimit-Remaining", "NaN"}, server, nil},
		{"nothing", []string{"Content-Type", "text/plain"}, server, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for i := 0; i < len(tc.hdr); i += 2 {
				h.Add(tc.hdr[i], tc.hdr[i+1])
			}
			got := parseReport(h, serverNow(h, tc.at))
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %+v; want %+v", got, tc.want)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	server := time.Date(2026, 10, 21, 7, 28, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"30", 30 * time.Second, true},
		{"1.5", 1500 * time.Millisecond, true},
		{"Wed, 21 Oct 2026 07:28:45 GMT", 45 * time.Second, true},
		{"Wed, 21 Oct 2026 07:00:00 GMT", 0, true}, // in the past: now
		{"-5", 0, false},
		{"tomorrow", 0, false},
		{"", 0, false},
	} {
		h := http.Header{"Retry-After": {tc.v}}
		if got, ok := retryAfter(h, server); got != tc.want || ok != tc.ok {
			t.Errorf("Retry-After %q: %v, %v; want %v, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzHeaders: whatever a server sends, the parsers stay within their
// bounds (no negative count or delay, none beyond maxCount or maxDelay).
func FuzzHeaders(f *testing.F) {
	f.Add(`"a";r=7;t=2, "b";r=1;t=9`, `"a";q=20;w=2`, "5", "1893456042", "30", "Tue, 01 Jan 2030 00:00:00 GMT")
	f.Add(`x;r=-1`, `;q=1e99`, "1e300", "-4", "Wed, 21 Oct 2026 07:28:00 GMT", "garbage")
	f.Fuzz(func(t *testing.T, rl, policy, remaining, reset, retry, date string) {
		h := http.Header{}
		h.Set("RateLimit", rl)
		h.Set("RateLimit-Policy", policy)
		h.Set("X-RateLimit-Remaining", remaining)
		h.Set("X-RateLimit-Reset", reset)
		h.Set("Retry-After", retry)
		h.Set("Date", date)
		now := serverNow(h, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		for _, r := range parseReport(h, now) {
			if r.remaining < 0 || r.remaining > maxCount || r.limit < 0 || r.limit > maxCount || r.reset < 0 || r.reset > maxDelay {
				t.Fatalf("out of bounds: %+v", r)
			}
		}
		if d, ok := retryAfter(h, now); ok && (d < 0 || d > maxDelay) {
			t.Fatalf("Retry-After %q: %v", retry, d)
		}
	})
}
