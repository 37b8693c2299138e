package pace_test

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip/internal/testkit/pipenet"
	"github.com/driplimit/drip/pace"
)

// serve runs h on an in-memory network inside the current synctest bubble
// and returns a client whose transport is pace.New over that network. The
// server and the connections stop when the test ends.
func serve(t *testing.T, h http.Handler, opts ...pace.Option) (*http.Client, *pace.Transport) {
	t.Helper()
	ln := pipenet.Listen()
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	base := &http.Transport{DialContext: ln.Dial, MaxIdleConnsPerHost: 64}
	tr := pace.New(base, opts...)
	t.Cleanup(func() {
		srv.Close()
		base.CloseIdleConnections()
	})
	return &http.Client{Transport: tr}, tr
}

// window is a server with a fixed-window limit that speaks the GitHub-style
// headers: limit requests per period, counted when a request arrives,
// answered after latency(n) for the n-th request (so that answers overlap
// and come back out of order). Over the limit: 429 with Remaining 0 and
// the Reset, no Retry-After.
type window struct {
	limit   int
	period  time.Duration
	latency func(n int) time.Duration

	mu       sync.Mutex
	cur      int64 // the window's index
	used     int
	n        int
	ok, over int
	inflight int
	peak     int // most requests in the handler at once
}

func (s *window) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	s.mu.Lock()
	idx := now.UnixNano() / int64(s.period)
	if idx != s.cur {
		s.cur, s.used = idx, 0
	}
	allowed := s.used < s.limit
	if allowed {
		s.used++
		s.ok++
	} else {
		s.over++
	}
	remaining := s.limit - s.used
	s.n++
	n := s.n
	s.inflight++
	s.peak = max(s.peak, s.inflight)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight--
		s.mu.Unlock()
	}()
	reset := time.Unix(0, (idx+1)*int64(s.period))
	h := w.Header()
	h.Set("X-RateLimit-Limit", strconv.Itoa(s.limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
	if s.latency != nil {
		time.Sleep(s.latency(n))
	}
	if !allowed {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	io.WriteString(w, "hello\n")
}

func (s *window) counts() (ok, over, peak int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ok, s.over, s.peak
}

// get sends a GET and reads the whole answer.
func get(c *http.Client, url string) (int, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// TestSteadyStateGitHubStyle: 8 goroutines ask a fixed window of 50
// requests per 10 s for 1,000 requests in all. The client must get no 429
// and use the windows fully: about 5 requests a second.
func TestSteadyStateGitHubStyle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &window{limit: 50, period: 10 * time.Second,
			latency: func(n int) time.Duration { return time.Duration(n%7) * 3 * time.Millisecond }}
		c, _ := serve(t, s)
		start := time.Now()
		var wg sync.WaitGroup
		var got429 atomic.Int64
		for range 8 {
			wg.Go(func() {
				for range 125 {
					status, err := get(c, "http://api.example/repos")
					if err != nil {
						t.Error(err)
						return
					}
					if status == http.StatusTooManyRequests {
						got429.Add(1)
					}
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		ok, over, _ := s.counts()
		rate := float64(ok-50) / elapsed.Seconds()
		t.Logf("%d allowed, %d refused by the server, %d 429s seen by callers, in %v of virtual time: %.2f/s after the first window (the limit: 5/s)", ok, over, got429.Load(), elapsed, rate)
		if over != 0 || got429.Load() != 0 {
			t.Errorf("the server refused %d requests (callers saw %d 429s); want none", over, got429.Load())
		}
		if ok != 1000 {
			t.Errorf("%d requests allowed, want 1000", ok)
		}
		// 1,000 requests are 20 windows of 50: the last starts at 190 s.
		if elapsed < 190*time.Second || elapsed > 192*time.Second {
			t.Errorf("1,000 requests took %v, want 190 s and a little (the 20th window's start)", elapsed)
		}
	})
}

// TestNoStampede: 40 goroutines wait out an exhausted window; when it
// opens, no more than the quota goes out at once, and none is refused.
func TestNoStampede(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &window{limit: 10, period: time.Minute,
			latency: func(int) time.Duration { return 50 * time.Millisecond }}
		c, _ := serve(t, s)
		for range 10 { // use up the first window
			if status, err := get(c, "http://api.example/"); err != nil || status != 200 {
				t.Fatalf("status %d, err %v", status, err)
			}
		}
		var wg sync.WaitGroup
		for range 40 {
			wg.Go(func() {
				if _, err := get(c, "http://api.example/"); err != nil && !errors.Is(err, pace.ErrWaitTooLong) {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		ok, over, peak := s.counts()
		if over != 0 {
			t.Errorf("%d requests refused, want none", over)
		}
		if peak > 10 {
			t.Errorf("%d requests in flight at once, want at most the quota of 10", peak)
		}
		if ok != 20 {
			t.Errorf("%d allowed, want 20 (two windows; the rest would wait over a minute)", ok)
		}
	})
}

// TestManyWaiters: 200 goroutines share a fixed window of 37 requests per
// 3 s for 2,000 requests. Waiters go in the order they came, so none
// starves past MaxWait (the average wait is 16 s, MaxWait a minute), none
// is refused, and no more than the quota is ever in flight.
func TestManyWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &window{limit: 37, period: 3 * time.Second,
			latency: func(n int) time.Duration { return time.Duration((n*7919)%50) * time.Millisecond }}
		c, _ := serve(t, s)
		start := time.Now()
		var wg sync.WaitGroup
		for range 200 {
			wg.Go(func() {
				for range 10 {
					if _, err := get(c, "http://api.example/"); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		ok, over, peak := s.counts()
		t.Logf("%d allowed, %d refused, at most %d in flight, in %v of virtual time", ok, over, peak, time.Since(start))
		if ok != 2000 || over != 0 || peak > 37 {
			t.Errorf("%d allowed, %d refused, %d in flight at once; want 2000, 0, at most 37", ok, over, peak)
		}
	})
}
