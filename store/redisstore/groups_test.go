package redisstore_test

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

// TestConcurrentMultiTakes: 64 callers at once, each multi-take all or
// nothing in one call (beside the batched single keys by default, without
// batching, and with scripts): a pair a+b and a pair a+c, where b and c run out and
// a never does, so a denied pair must leave a untouched. Exactly b's and
// c's bursts are granted, and a lost exactly what they were granted.
func TestConcurrentMultiTakes(t *testing.T) {
	url := testserver.SharedRedisURL(t)
	for name, opts := range map[string][]redisstore.Option{
		"batched":   nil,
		"unbatched": {redisstore.WithoutBatching()},
		"scripts":   {redisstore.WithScripts()},
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t, url, append(opts, redisstore.WithPrefix(randomTag()+":"))...)
			day := 24 * time.Hour
			wide := drip.Limit{Rate: 1, Period: day, Burst: 1000}
			narrow := drip.Limit{Rate: 1, Period: day, Burst: 100}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var ab, ac atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for w := range 64 {
				wg.Go(func() {
					for i := range 8 {
						other, n := "b", &ab
						if (w+i)%2 == 1 {
							other, n = "c", &ac
						}
						m, err := drip.Apply(ctx, s, bucket.Take, time.Time{},
							drip.Request{Key: "a", Limit: wide, Cost: 1}, drip.Request{Key: other, Limit: narrow, Cost: 1})
						if err != nil {
							errs <- err
							return
						}
						if m.Allowed {
							n.Add(1)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if ab.Load() != 100 || ac.Load() != 100 {
				t.Fatalf("granted a+b %d times and a+c %d times of 256 each, want each pair's burst of 100", ab.Load(), ac.Load())
			}
			m, err := drip.Apply(ctx, s, bucket.Peek, time.Time{}, drip.Request{Key: "a", Limit: wide, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			// A peek answers as a take of its cost would leave the bucket.
			if got := m.Decisions[0].Remaining; got != 799 {
				t.Fatalf("a peek of 1 on a leaves %d, want 1000 - 200 granted - 1 = 799 (a denied pair took from a)", got)
			}
		})
	}
}

// TestMultiTakesBatched: multi-takes wait for a batch beside single
// takes, and the batch decides each in its place, all or nothing. With
// one call in flight at a stopped server, four single takes and six
// multi-takes of two keys queue; once the server runs again they all go
// in one call (two calls in all, where each multi-take was a call of its
// own before), the four pairs on fresh keys are granted, the two pairs
// with an empty bucket are denied and take nothing from the other key.
func TestMultiTakesBatched(t *testing.T) {
	srv := testserver.StartRedis(t)
	s := open(t, srv.URL(), redisstore.WithBatching(redisstore.Batching{MaxBatch: 64, InFlight: 1}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	day := 24 * time.Hour
	wide := drip.Limit{Rate: 1, Period: day, Burst: 1000}
	one := drip.Limit{Rate: 1, Period: day, Burst: 1}
	// The bucket "empty" emptied first (which also loads the library and
	// learns the server's clock).
	if m, err := drip.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: "empty", Limit: one, Cost: 1}); err != nil || !m.Allowed {
		t.Fatalf("emptying: %+v %v", m, err)
	}
	before := fcalls(t, srv)
	resume := pause(t, srv)
	defer resume()
	var wg sync.WaitGroup
	allowed := make([]bool, 11)
	errs := make(chan error, 11)
	take := func(i int, reqs ...drip.Request) {
		wg.Go(func() {
			m, err := drip.Apply(ctx, s, bucket.Take, time.Time{}, reqs...)
			if err != nil {
				errs <- err
				return
			}
			allowed[i] = m.Allowed
		})
	}
	wait := func(what string, cond func() bool) {
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				running, queued := redisstore.Running(s), redisstore.Queued(s)
				resume()
				t.Fatalf("%s: not after 30 s (running %d, queued %d)", what, running, queued)
			}
		}
	}
	take(0, drip.Request{Key: "a", Limit: wide, Cost: 1})
	wait("the first call in flight", func() bool { return redisstore.Running(s) == 1 })
	for i := 1; i <= 10; i++ {
		switch {
		case i <= 4:
			take(i, drip.Request{Key: "a", Limit: wide, Cost: 1})
		case i <= 8:
			take(i, drip.Request{Key: "a", Limit: wide, Cost: 1}, drip.Request{Key: fmt.Sprint("b", i), Limit: wide, Cost: 1})
		default:
			take(i, drip.Request{Key: "a", Limit: wide, Cost: 1}, drip.Request{Key: "empty", Limit: one, Cost: 1})
		}
	}
	wait("ten calls queued behind it", func() bool { return redisstore.Queued(s) == 10 })
	resume()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, ok := range allowed[:9] {
		if !ok {
			t.Errorf("call %d denied, want allowed", i)
		}
	}
	if allowed[9] || allowed[10] {
		t.Errorf("a pair with the empty bucket allowed: %v", allowed[9:])
	}
	if n := fcalls(t, srv) - before; n != 2 {
		t.Errorf("%d calls of the script, want 2 (the first, then one batch of the ten behind it)", n)
	}
	d, err := storetest.Apply(ctx, s, bucket.Peek, time.Time{}, drip.Request{Key: "a", Limit: wide, Cost: 0})
	if err != nil || d.Tokens != 1000-9 {
		t.Fatalf("a holds %v (err %v), want 1000 - 9 granted: a denied pair took from it", d.Tokens, err)
	}
}

// TestJoinedBatchAgainstMemstore: one batch of single requests and
// multi-takes of every kind (token buckets, fixed and sliding windows,
// concurrency slots with their lease IDs, peeks and refunds), queued in
// a known order behind a call in flight at a stopped server, decides as
// the memory store does, call by call, in that order: each multi-take
// all or nothing in its place, the lease IDs after it read as its own.
func TestJoinedBatchAgainstMemstore(t *testing.T) {
	srv := testserver.StartRedis(t)
	s := open(t, srv.URL(), redisstore.WithBatching(redisstore.Batching{MaxBatch: 64, InFlight: 1}))
	mem := memstore.New()
	defer mem.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	at := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	tb := drip.Limit{Rate: 2, Period: time.Minute, Burst: 2}
	fw := drip.Limit{Algorithm: drip.FixedWindow, Rate: 3, Period: time.Minute}
	sw := drip.Limit{Algorithm: drip.SlidingWindow, Rate: 2, Period: time.Minute, Slots: 4}
	cc := drip.InFlight(1, 10*time.Second)
	type call struct {
		op   bucket.Op
		reqs []drip.Request
	}
	r := func(key string, l drip.Limit, lease string) drip.Request {
		return drip.Request{Key: key, Limit: l, Cost: 1, Lease: lease}
	}
	calls := []call{
		{bucket.Take, []drip.Request{r("first", tb, "")}}, // the call in flight
		{bucket.Take, []drip.Request{r("t", tb, ""), r("c", cc, "x")}},
		{bucket.Take, []drip.Request{r("c", cc, "y")}}, // the slot is x's
		{bucket.Take, []drip.Request{r("t", tb, ""), r("c", cc, "y"), r("w", fw, "")}},
		{bucket.Take, []drip.Request{r("t", tb, ""), r("w", fw, "")}},
		{bucket.Take, []drip.Request{r("t", tb, ""), r("s", sw, "")}}, // t is empty: s untouched
		{bucket.Peek, []drip.Request{r("s", sw, ""), r("w", fw, "")}},
		{bucket.Refund, []drip.Request{r("c", cc, "x"), r("t", tb, "")}},
		{bucket.Take, []drip.Request{r("c", cc, "y")}},
		{bucket.Take, []drip.Request{r("s", sw, ""), r("w", fw, ""), r("s2", sw, "")}},
		{bucket.Take, []drip.Request{r("w", fw, "")}}, // the window's third
		{bucket.Take, []drip.Request{r("w", fw, ""), r("t", tb, "")}},
	}
	want := make([]drip.Multi, len(calls))
	for i, c := range calls {
		m, err := drip.Apply(ctx, mem, c.op, at, c.reqs...)
		if err != nil {
			t.Fatalf("memstore, call %d: %v", i, err)
		}
		want[i] = m
	}
	// The library loaded and the server's clock learned first.
	if _, err := drip.Apply(ctx, s, bucket.Peek, at, r("warm", tb, "")); err != nil {
		t.Fatal(err)
	}
	before := fcalls(t, srv)
	resume := pause(t, srv)
	defer resume()
	got := make([]drip.Multi, len(calls))
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Go(func() { got[i], errs[i] = drip.Apply(ctx, s, c.op, at, c.reqs...) })
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			running, queued := redisstore.Running(s), redisstore.Queued(s)
			if (i == 0 && running == 1) || (i > 0 && queued == i) {
				break
			}
			if time.Now().After(deadline) {
				resume()
				t.Fatalf("call %d not queued after 30 s (running %d, queued %d)", i, running, queued)
			}
		}
	}
	resume()
	wg.Wait()
	for i := range calls {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("call %d (%v of %d): redisstore\n%+v\nmemstore\n%+v", i, calls[i].op, len(calls[i].reqs), got[i], want[i])
		}
	}
	if n := fcalls(t, srv) - before; n != 2 {
		t.Errorf("%d calls of the script, want 2", n)
	}
}

// pause pauses srv; resume resumes it, once, however often it is called
// (the test may resume it early, and defers it besides).
func pause(t *testing.T, srv *testserver.Redis) (resume func()) {
	t.Helper()
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if err := srv.Resume(); err != nil {
				t.Error(err)
			}
		})
	}
}
