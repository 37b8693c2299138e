package batch

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// recorder is a run function that records the batches it gets and the
// deadline of each call's context, and answers each request with itself
// doubled. While gate is open it returns at once; otherwise it waits for
// gate or its context.
type recorder struct {
	mu        sync.Mutex
	batches   [][]int
	deadlines []time.Time
	forever   int // calls whose context had no deadline
	gate      chan struct{}
}

func (r *recorder) run(ctx context.Context, calls []*Call[int, int]) {
	var b []int
	for _, c := range calls {
		b = append(b, c.Req)
	}
	d, ok := ctx.Deadline()
	r.mu.Lock()
	r.batches = append(r.batches, b)
	if ok {
		r.deadlines = append(r.deadlines, d)
	} else {
		r.forever++
	}
	r.mu.Unlock()
	select {
	case <-r.gate:
	case <-ctx.Done():
		for _, c := range calls {
			c.Err = ctx.Err()
		}
		return
	}
	for _, c := range calls {
		c.Res = 2 * c.Req
	}
}

func TestBatchesAndAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{gate: make(chan struct{})}
		b := New(Options{MaxBatch: 4, InFlight: 1}, nil, r.run, nil)
		defer b.Close()
		// The first request occupies the worker; the next 6 queue, and go
		// in batches of at most 4 once it answers.
		var wg sync.WaitGroup
		res := make([]int, 7)
		for i := range 7 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := b.Do(context.Background(), i)
				if err != nil {
					t.Error(err)
				}
				res[i] = v
			}()
			synctest.Wait()
		}
		if got := b.Running(); got != 1 {
			t.Errorf("Running = %d with one worker busy, want 1", got)
		}
		close(r.gate)
		wg.Wait()
		b.Close() // the worker is done with r
		for i, v := range res {
			if v != 2*i {
				t.Errorf("request %d answered %d, want %d", i, v, 2*i)
			}
		}
		want := [][]int{{0}, {1, 2, 3, 4}, {5, 6}}
		if len(r.batches) != len(want) {
			t.Fatalf("batches %v, want %v", r.batches, want)
		}
		for i := range want {
			if len(r.batches[i]) != len(want[i]) {
				t.Fatalf("batches %v, want %v", r.batches, want)
			}
		}
		if r.forever != 3 {
			t.Errorf("%d of 3 calls without callers' deadlines ran without one", r.forever)
		}
	})
}

// TestLatestDeadline: a call runs under the latest deadline among its live
// callers; callers that left before it was sent are not sent, and callers
// return at their own deadlines.
func TestLatestDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{gate: make(chan struct{})}
		b := New(Options{MaxBatch: 8, InFlight: 1}, nil, r.run, nil)
		defer b.Close()
		start := time.Now()
		var wg sync.WaitGroup
		do := func(req int, timeout time.Duration) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_, err := b.Do(ctx, req)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("request %d: %v, want the deadline", req, err)
			}
			if late := time.Since(start) - timeout; late != 0 {
				t.Errorf("request %d returned %v after its deadline", req, late)
			}
		}
		// Request 0 holds the worker (and the gate stays shut) until its
		// deadline, 1 s; request 1 leaves after 500 ms, before it can be
		// sent; 2 and 3 wait with 3 s and 2 s.
		wg.Add(4)
		go do(0, time.Second)
		synctest.Wait()
		go do(1, 500*time.Millisecond)
		go do(2, 3*time.Second)
		go do(3, 2*time.Second)
		wg.Wait()
		b.Close() // the worker is done with r
		if len(r.batches) != 2 || len(r.batches[1]) != 2 {
			t.Fatalf("batches %v, want [0] then [2 3] (1 left before it was sent)", r.batches)
		}
		if d := r.deadlines[0].Sub(start); d != time.Second {
			t.Errorf("first call's deadline %v, want its caller's, 1s", d)
		}
		if d := r.deadlines[1].Sub(start); d != 3*time.Second {
			t.Errorf("second call's deadline %v, want the latest of its callers', 3s", d)
		}
	})
}

// TestRoute: with a route, requests of one route go to one worker's queue,
// in order.
func TestRoute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{gate: make(chan struct{})}
		close(r.gate)
		b := New(Options{MaxBatch: 16, InFlight: 4}, func(q int) uint64 { return uint64(q % 4) }, r.run, nil)
		defer b.Close()
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := b.Do(context.Background(), i); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		b.Close() // the worker is done with r
		for _, batch := range r.batches {
			for _, q := range batch {
				if q%4 != batch[0]%4 {
					t.Fatalf("batch %v mixes routes", batch)
				}
			}
		}
	})
}

func TestClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{gate: make(chan struct{})}
		b := New(Options{MaxBatch: 4, InFlight: 1}, nil, r.run, nil)
		errs := make(chan error, 2)
		for i := range 2 {
			go func() { _, err := b.Do(context.Background(), i); errs <- err }()
			synctest.Wait()
		}
		b.Close() // cancels the call in flight, fails the queued one
		for range 2 {
			if err := <-errs; err == nil {
				t.Error("a request answered after Close")
			}
		}
		if _, err := b.Do(context.Background(), 9); !errors.Is(err, ErrClosed) {
			t.Errorf("Do after Close: %v, want ErrClosed", err)
		}
	})
}

func TestClock(t *testing.T) {
	var k Clock
	t0 := time.Unix(1_700_000_000, 0)
	if k.Known() || k.Deadline(t0.Add(time.Second)) != 0 {
		t.Fatal("a deadline before any observation")
	}
	// The server's clock is 5 s ahead; replies take 3 ms, then 1 ms.
	const ahead = 5 * time.Second
	k.Observe(t0.Add(3*time.Millisecond), t0.Add(ahead).UnixNano())
	k.Observe(t0.Add(time.Second+time.Millisecond), t0.Add(time.Second+ahead).UnixNano())
	// A slower reply later does not move the bound back...
	k.Observe(t0.Add(2*time.Second+50*time.Millisecond), t0.Add(2*time.Second+ahead).UnixNano())
	d := t0.Add(3 * time.Second)
	if got, want := k.Deadline(d), d.Add(ahead-time.Millisecond).UnixNano(); got != want {
		t.Errorf("deadline %d, want %d (the best bound)", got, want)
	}
	if k.Deadline(time.Time{}) != 0 {
		t.Error("no deadline became one")
	}
	// A slow reply after a period turns does not become the estimate
	// either: the previous period's best still counts (a busy host delays
	// the replies it reads; one of them must not make every deadline
	// early).
	k.Observe(t0.Add(Refresh+2*time.Second+200*time.Millisecond), t0.Add(Refresh+2*time.Second+ahead).UnixNano())
	if got, want := k.Deadline(d), d.Add(ahead-time.Millisecond).UnixNano(); got != want {
		t.Errorf("after a slow reply in a new period: deadline %d, want %d", got, want)
	}
	// A server clock that stepped back an hour is followed once the
	// better bound is more than a period old...
	k.Observe(t0.Add(2*Refresh+3*time.Second), t0.Add(2*Refresh+3*time.Second-time.Hour).UnixNano())
	if got, want := k.Deadline(d), d.Add(ahead-200*time.Millisecond).UnixNano(); got != want {
		t.Errorf("one period on: deadline %d, want %d (the last period's best)", got, want)
	}
	k.Observe(t0.Add(3*Refresh+4*time.Second), t0.Add(3*Refresh+4*time.Second-time.Hour).UnixNano())
	if got, want := k.Deadline(d), d.Add(-time.Hour).UnixNano(); got != want {
		t.Errorf("after a clock step: deadline %d, want %d", got, want)
	}
	// ...and at once after Forget (a reconnect), from the next sample.
	k.Observe(t0.Add(3*Refresh+5*time.Second), t0.Add(3*Refresh+5*time.Second+ahead).UnixNano())
	k.Forget()
	if k.Known() || k.Deadline(d) != 0 {
		t.Fatal("Forget kept an offset")
	}
	k.Observe(t0.Add(3*Refresh+6*time.Second), t0.Add(3*Refresh+6*time.Second-time.Minute).UnixNano())
	if got, want := k.Deadline(d), d.Add(-time.Minute).UnixNano(); got != want {
		t.Errorf("after Forget: deadline %d, want %d", got, want)
	}
}

// TestSendBy: the server must decide a fifth of the caller's time before
// the caller gives up, at least MinMargin and at most MaxMargin before.
func TestSendBy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		if !SendBy(context.Background()).IsZero() {
			t.Error("a context without a deadline got one")
		}
		for _, c := range []struct{ left, margin time.Duration }{
			{time.Millisecond, MinMargin},
			{20 * time.Millisecond, 4 * time.Millisecond},
			{250 * time.Millisecond, 50 * time.Millisecond},
			{500 * time.Millisecond, MaxMargin},
			{time.Minute, MaxMargin},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), c.left)
			d, _ := ctx.Deadline()
			if got := SendBy(ctx); !got.Equal(d.Add(-c.margin)) {
				t.Errorf("%v left: send by %v before the deadline, want %v", c.left, d.Sub(got), c.margin)
			}
			cancel()
		}
	})
}

// TestUndo: a caller that leaves before its answer comes gets its
// context's error, and the answer is taken back by the request Undo names,
// run by the worker at once; a caller answered in time is not undone, nor
// is one that left before its request was sent.
func TestUndo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var ran [][]int
		// The server answers each request with itself, after 2 s, past
		// the context of the call (as redisstore waits for its answer).
		run := func(ctx context.Context, calls []*Call[int, int]) {
			var b []int
			for _, c := range calls {
				b = append(b, c.Req)
			}
			mu.Lock()
			ran = append(ran, b)
			mu.Unlock()
			time.Sleep(2 * time.Second)
			for _, c := range calls {
				c.Res = c.Req
			}
		}
		undo := func(q, r int) (int, bool) { return -q, r > 0 } // only positive answers changed anything
		b := New(Options{MaxBatch: 4, InFlight: 1}, nil, run, undo)
		defer b.Close()

		// Left at 1 s: its answer (at 2 s) is taken back.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := b.Do(ctx, 7); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Do = %v, want the deadline's error", err)
		}
		synctest.Wait() // the worker: the answer, then the takeback
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if n, failed := b.Undone(); n != 1 || failed != 0 {
			t.Errorf("Undone = %d, %d failed; want 1, 0", n, failed)
		}

		// Answered in time: kept.
		if v, err := b.Do(context.Background(), 5); err != nil || v != 5 {
			t.Errorf("Do = %d, %v; want 5", v, err)
		}
		// A negative answer changed nothing: not undone.
		ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
		defer cancel2()
		if _, err := b.Do(ctx2, -3); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Do = %v, want the deadline's error", err)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()

		// Left before it was sent (the worker busy with 11): never sent,
		// nothing to take back.
		go b.Do(context.Background(), 11)
		synctest.Wait()
		ctx3, cancel3 := context.WithTimeout(context.Background(), time.Second)
		defer cancel3()
		if _, err := b.Do(ctx3, 13); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Do = %v, want the deadline's error", err)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()

		mu.Lock()
		defer mu.Unlock()
		want := [][]int{{7}, {-7}, {5}, {-3}, {11}}
		if len(ran) != len(want) {
			t.Fatalf("calls %v, want %v", ran, want)
		}
		for i := range want {
			if len(ran[i]) != len(want[i]) || ran[i][0] != want[i][0] {
				t.Fatalf("calls %v, want %v", ran, want)
			}
		}
		if n, _ := b.Undone(); n != 1 {
			t.Errorf("Undone = %d, want 1", n)
		}
	})
}

// TestQueuedSaysSo: a caller whose deadline passes while its request waits
// in the batcher's queue (the store's calls in flight are busy) gets a
// deadline error that says it was never sent, so that time spent in drip
// is not taken for the store's.
func TestQueuedSaysSo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		b := New(Options{MaxBatch: 1, InFlight: 1}, nil, func(ctx context.Context, calls []*Call[int, int]) {
			<-release
			for _, c := range calls {
				c.Res = c.Req
			}
		}, nil)
		defer b.Close()
		go b.Do(context.Background(), 1) // holds the one call in flight
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := b.Do(ctx, 2)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "never sent") {
			t.Errorf("queued past its deadline: %v", err)
		}
		close(release)
	})
}
