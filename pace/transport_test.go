package pace_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip/pace"
)

// script is a base RoundTripper that answers with the next of its replies
// (the last one once they run out), and records what was sent and when.
type script struct {
	mu      sync.Mutex
	replies []reply
	sent    []sent
}

type reply struct {
	status int
	hdr    []string
}

type sent struct {
	at     time.Time
	method string
	body   string
}

func (s *script) RoundTrip(r *http.Request) (*http.Response, error) {
	body := ""
	if r.Body != nil {
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		body = string(b)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, sent{time.Now(), r.Method, body})
	rep := s.replies[min(len(s.sent), len(s.replies))-1]
	h := http.Header{}
	for i := 0; i < len(rep.hdr); i += 2 {
		h.Add(rep.hdr[i], rep.hdr[i+1])
	}
	return &http.Response{StatusCode: rep.status, Header: h, Body: io.NopCloser(strings.NewReader("body")), Request: r}, nil
}

func (s *script) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sent)
}

var (
	ok2   = reply{200, []string{"RateLimit", `"a";r=2;t=10`, "RateLimit-Policy", `"a";q=3;w=10`}}
	empty = reply{200, []string{"RateLimit", `"a";r=0;t=10`, "RateLimit-Policy", `"a";q=3;w=10`}}
	plain = reply{200, nil}
)

func do(t *testing.T, c *http.Client, method, body string) (*http.Response, error) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://api.example/x", rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	return resp, err
}

// TestWaitsForReset: with nothing left, the next request waits for the
// reset, then goes.
func TestWaitsForReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{replies: []reply{empty, ok2}}
		c := &http.Client{Transport: pace.New(s)}
		start := time.Now()
		for range 2 {
			if _, err := do(t, c, "GET", ""); err != nil {
				t.Fatal(err)
			}
		}
		if got := s.sent[1].at.Sub(start); got != 10*time.Second {
			t.Errorf("the second request went after %v, want the reset: 10s", got)
		}
	})
}

// TestMaxWait: a wait beyond MaxWait fails at once, without sending, with
// an error that is ErrWaitTooLong; one within it waits.
func TestMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{replies: []reply{empty, ok2}}
		c := &http.Client{Transport: pace.New(s, pace.WithMaxWait(5*time.Second))}
		do(t, c, "GET", "")
		start := time.Now()
		_, err := do(t, c, "GET", "")
		var we *pace.WaitError
		if !errors.Is(err, pace.ErrWaitTooLong) || !errors.As(err, &we) || we.Wait != 10*time.Second || we.Key != "api.example" {
			t.Fatalf("err = %v (%+v), want a WaitError of 10s for api.example that is ErrWaitTooLong", err, we)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v is DeadlineExceeded; MaxWait was the bound", err)
		}
		if time.Since(start) != 0 || s.count() != 1 {
			t.Errorf("took %v and sent %d; want at once and nothing sent", time.Since(start), s.count()-1)
		}
	})
}

// TestDeadline: a wait past the request's deadline fails at once, and is
// both ErrWaitTooLong and context.DeadlineExceeded.
func TestDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{replies: []reply{empty, ok2}}
		c := &http.Client{Transport: pace.New(s)}
		do(t, c, "GET", "")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.example/x", nil)
		start := time.Now()
		_, err := c.Do(req)
		if !errors.Is(err, pace.ErrWaitTooLong) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrWaitTooLong and DeadlineExceeded", err)
		}
		if time.Since(start) != 0 || s.count() != 1 {
			t.Errorf("took %v and sent %d; want at once and nothing sent", time.Since(start), s.count()-1)
		}
		// A cancellation while waiting ends the wait.
		ctx, cancel = context.WithCancel(context.Background())
		req, _ = http.NewRequestWithContext(ctx, "GET", "http://api.example/x", nil)
		go func() { time.Sleep(time.Second); cancel() }()
		if _, err := c.Do(req); !errors.Is(err, context.Canceled) || time.Since(start) != time.Second {
			t.Fatalf("err = %v after %v, want Canceled after 1s", err, time.Since(start))
		}
	})
}

// TestRetry429 covers which refusals are retried, when, and how often.
func TestRetry429(t *testing.T) {
	refused := reply{429, []string{"Retry-After", "3"}}
	unavailable := reply{503, []string{"Retry-After", "2"}}
	for _, tc := range []struct {
		name      string
		method    string
		body      string
		noGetBody bool
		replies   []reply
		opts      []pace.Option
		status    int             // what the caller gets
		sends     int             // how many went out
		after     []time.Duration // when the retries went, from the start
	}{
		{"GET after Retry-After", "GET", "", false, []reply{refused, ok2}, nil, 200, 2, []time.Duration{3 * time.Second}},
		{"POST with GetBody, body sent again", "POST", "payload", false, []reply{refused, ok2}, nil, 200, 2, []time.Duration{3 * time.Second}},
		{"POST whose body cannot be read again", "POST", "payload", true, []reply{refused, ok2}, nil, 429, 1, nil},
		{"a 429 that says not when", "GET", "", false, []reply{{429, nil}, ok2}, nil, 429, 1, nil},
		{"a 429 with a reset and no Retry-After", "GET", "", false, []reply{{429, []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "4"}}, ok2}, nil, 200, 2, []time.Duration{4 * time.Second}},
		{"at most the retries", "GET", "", false, []reply{refused}, []pace.Option{pace.WithRetries(2)}, 429, 3, []time.Duration{3 * time.Second, 6 * time.Second}},
		{"no retries", "GET", "", false, []reply{refused, ok2}, []pace.Option{pace.WithRetries(0)}, 429, 1, nil},
		{"a Retry-After past MaxWait: the refusal", "GET", "", false, []reply{refused, ok2}, []pace.Option{pace.WithMaxWait(time.Second)}, 429, 1, nil},
		{"503 GET", "GET", "", false, []reply{unavailable, ok2}, nil, 200, 2, []time.Duration{2 * time.Second}},
		{"503 POST: maybe not idempotent", "POST", "x", false, []reply{unavailable, ok2}, nil, 503, 1, nil},
		{"503 without Retry-After", "GET", "", false, []reply{{503, nil}, ok2}, nil, 503, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &script{replies: tc.replies}
				c := &http.Client{Transport: pace.New(s, tc.opts...)}
				var rd io.Reader
				if tc.body != "" {
					rd = strings.NewReader(tc.body)
				}
				req, _ := http.NewRequest(tc.method, "http://api.example/x", rd)
				if tc.noGetBody {
					req.GetBody = nil
				}
				start := time.Now()
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.status || string(b) != "body" {
					t.Errorf("status %d, body %q; want %d, %q", resp.StatusCode, b, tc.status, "body")
				}
				if len(s.sent) != tc.sends {
					t.Fatalf("%d sent, want %d", len(s.sent), tc.sends)
				}
				for i, at := range tc.after {
					if got := s.sent[i+1].at.Sub(start); got != at {
						t.Errorf("retry %d went at %v, want %v", i+1, got, at)
					}
				}
				for _, x := range s.sent {
					if x.body != tc.body {
						t.Errorf("sent body %q, want %q", x.body, tc.body)
					}
				}
			})
		})
	}
}

// TestServerWithoutHeaders: after the probe, a server that sends no rate
// limit headers is not paced.
func TestServerWithoutHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var inflight, peak atomic.Int64
		c, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := inflight.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(time.Second)
			inflight.Add(-1)
		}))
		get(c, "http://plain.example/")
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() { get(c, "http://plain.example/") })
		}
		wg.Wait()
		if peak.Load() != 5 {
			t.Errorf("%d requests in flight at once, want all 5", peak.Load())
		}
	})
}

// TestProbeFirst: a new key sends one request, and the others wait for
// what its answer says.
func TestProbeFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &window{limit: 3, period: time.Minute, latency: func(int) time.Duration { return time.Second }}
		c, _ := serve(t, s, pace.WithMaxWait(30*time.Second))
		var wg sync.WaitGroup
		var refused atomic.Int64
		for range 10 {
			wg.Go(func() {
				if _, err := get(c, "http://api.example/"); errors.Is(err, pace.ErrWaitTooLong) {
					refused.Add(1)
				}
			})
		}
		wg.Wait()
		ok, over, peak := s.counts()
		if ok != 3 || over != 0 || peak != 2 || refused.Load() != 7 {
			t.Errorf("%d allowed, %d refused by the server, %d at once, %d refused by the transport; want 3, 0, 2 (after the probe) and 7", ok, over, peak, refused.Load())
		}
	})
}

// TestPerKey: WithKey keeps separate budgets on one host.
func TestPerKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{replies: []reply{empty}}
		tr := pace.New(s, pace.WithMaxWait(0), pace.WithKey(func(r *http.Request) string { return r.Header.Get("X-Api-Key") }))
		c := &http.Client{Transport: tr}
		for _, key := range []string{"k1", "k2", "k1"} {
			req, _ := http.NewRequest("GET", "http://api.example/x", nil)
			req.Header.Set("X-Api-Key", key)
			resp, err := c.Do(req)
			if key == "k1" && resp == nil {
				if !errors.Is(err, pace.ErrWaitTooLong) || s.count() != 2 {
					t.Fatalf("k1 again: err %v after %d sent, want ErrWaitTooLong after 2", err, s.count())
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			resp.Body.Close()
		}
	})
}

// TestMaxKeys: beyond WithMaxKeys, the least recently used key is
// forgotten (its next request is a probe, not a wait).
func TestMaxKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{replies: []reply{empty}}
		c := &http.Client{Transport: pace.New(s, pace.WithMaxWait(0), pace.WithMaxKeys(2))}
		send := func(host string) error {
			resp, err := c.Get("http://" + host + "/")
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		for _, h := range []string{"a", "b"} {
			if err := send(h); err != nil {
				t.Fatal(err)
			}
		}
		if err := send("a"); !errors.Is(err, pace.ErrWaitTooLong) {
			t.Fatalf("a, tracked and empty: err %v, want ErrWaitTooLong", err)
		}
		send("c") // a is the most recently used: b goes
		if err := send("b"); err != nil {
			t.Fatalf("b, forgotten: err %v, want it sent", err)
		}
	})
}

// fakeClock is a Clock whose time moves only when After is called: it
// jumps to the end of the wait, which it records.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	waits []time.Duration
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.waits = append(f.waits, d)
	f.now = f.now.Add(d)
	ch := make(chan time.Time, 1)
	ch <- f.now
	return ch
}

// TestClock: WithClock's clock is the one read and waited on.
func TestClock(t *testing.T) {
	clock := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := &script{replies: []reply{{200, []string{"Date", "Tue, 01 Jan 2030 00:00:00 GMT", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1893456042"}}, plain}}
	c := &http.Client{Transport: pace.New(s, pace.WithClock(clock))}
	for range 2 {
		if _, err := do(t, c, "GET", ""); err != nil {
			t.Fatal(err)
		}
	}
	if len(clock.waits) != 1 || clock.waits[0] != 42*time.Second {
		t.Errorf("waits %v, want one of 42s (the reset, a Unix time, from Date)", clock.waits)
	}
}

// TestMaxKeysKeepsBusy: the key forgotten is the least recently used one
// with nothing in flight, not a busy one.
func TestMaxKeysKeepsBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Host == "a" {
				time.Sleep(10 * time.Second)
			}
			w.Header().Set("RateLimit", `"x";r=0;t=60`)
		}), pace.WithMaxWait(0), pace.WithMaxKeys(2))
		done := make(chan error)
		go func() { _, err := get(c, "http://a/"); done <- err }() // a: in flight
		time.Sleep(time.Second)
		for _, h := range []string{"b", "c"} { // c is new: b goes, not a
			if _, err := get(c, "http://"+h+"/"); err != nil {
				t.Fatal(err)
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if _, err := get(c, "http://a/"); !errors.Is(err, pace.ErrWaitTooLong) {
			t.Errorf("a again: err %v, want ErrWaitTooLong (its state kept)", err)
		}
		if _, err := get(c, "http://b/"); err != nil {
			t.Errorf("b again: err %v, want it sent (forgotten)", err)
		}
	})
}
