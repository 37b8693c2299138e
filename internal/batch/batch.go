// Package batch coalesces concurrent single-key decisions into one store
// call each, for the stores that talk to a server (pgstore, redisstore).
//
// A Batcher has InFlight workers. With a route function each worker has a
// queue of its own and a request always goes to the same one (PostgreSQL:
// requests for one key are never split over statements that would wait on
// each other's row lock); without one the workers share a queue (Redis).
// A worker takes the first waiting request, gathers more (those already
// waiting, and with a window those that arrive within it) up to MaxBatch,
// and makes one call. Under light load a request goes alone at once; under
// heavy load batches form while the workers are busy, and at most InFlight
// calls are in flight.
//
// Deadlines. A request whose caller has left (its context ended) before
// its batch was sent is not sent, and every caller returns at its own
// deadline. A call runs under its callers' deadlines: its context ends at
// the latest deadline among the batch's live callers (or when the Batcher
// closes, if one of them has no deadline), so a stalled server cannot hold
// a worker past the callers it serves, and at most InFlight calls are in
// flight. (A store whose client cannot take back a command once queued
// may wait for its answer instead, for the same bound: redisstore.) Each
// request also carries its own caller's deadline to the store
// (Call.Deadline), which refuses to apply a request whose deadline passed
// (see Clock): a caller that got an error took nothing.
package batch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip/internal/spans"
)

// Options says how a store batches. The zero value turns batching off.
type Options struct {
	// Window is how long a worker gathers requests after the first one
	// (0: only those already waiting, so a lone request waits for
	// nothing).
	Window time.Duration
	// MaxBatch is the largest batch; 1 or less turns batching off.
	MaxBatch int
	// InFlight is how many calls may be in flight at once (at least 1).
	InFlight int
}

// On reports whether o batches at all.
func (o Options) On() bool { return o.MaxBatch > 1 }

// Or is o with def's MaxBatch if o's is zero and def's InFlight if o's is
// below 1: a store's WithBatching keeps its defaults for the fields left
// out.
func (o Options) Or(def Options) Options {
	if o.MaxBatch == 0 {
		o.MaxBatch = def.MaxBatch
	}
	if o.InFlight < 1 {
		o.InFlight = def.InFlight
	}
	return o
}

// ErrClosed is returned to requests made after Close, or still queued then.
var ErrClosed = errors.New("store closed")

// Call is one request in a batch, as the run function sees it.
type Call[Q, R any] struct {
	Req Q
	// Deadline is the caller's deadline (zero: none).
	Deadline time.Time
	// SendBy is when the server must have decided the request (zero:
	// never): Deadline less a margin for the reply (SendBy).
	SendBy time.Time
	// Res and Err are what run answers.
	Res R
	Err error

	ctx   context.Context
	done  chan struct{}
	state atomic.Uint32 // waiting, answered or left: who has the answer
	sent  atomic.Bool   // a worker sent it to the store
}

// A call's state: the worker sets answered when it hands the caller the
// answer, the caller sets left when it gives up; the first to change it
// from waiting decides.
const (
	waiting uint32 = iota
	answered
	left
)

// answer hands c its answer, or reports false when its caller left.
func (c *Call[Q, R]) answer() bool {
	if !c.state.CompareAndSwap(waiting, answered) {
		return false
	}
	c.done <- struct{}{}
	return true
}

// Undo returns the request that takes back what q did, given its answer r
// (false: q changed nothing, such as a denied take or a peek). The Batcher
// runs it when q's caller left before the answer came.
type Undo[Q, R any] func(q Q, r R) (Q, bool)

// UndoTimeout bounds the call that takes back the answers no caller got.
const UndoTimeout = 10 * time.Second

// Run decides calls in one store call under ctx, setting each call's Res
// or Err.
type Run[Q, R any] func(ctx context.Context, calls []*Call[Q, R])

// Batcher coalesces requests of type Q into calls of run, answering R.
type Batcher[Q, R any] struct {
	o      Options
	qs     []chan *Call[Q, R]
	route  func(Q) uint64
	run    Run[Q, R]
	undo   Undo[Q, R]
	pool   sync.Pool
	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	running atomic.Int64 // calls of run in progress
	// undone and undoFailed count the answers taken back, and those whose
	// undo failed (the store was gone): see Undone.
	undone, undoFailed atomic.Int64
}

// New starts a Batcher's workers; Close stops them. route (nil: one
// shared queue) picks a request's queue by its hash; undo (nil: none)
// takes back the answers whose callers left (see the package doc).
func New[Q, R any](o Options, route func(Q) uint64, run Run[Q, R], undo Undo[Q, R]) *Batcher[Q, R] {
	o.InFlight = max(1, o.InFlight)
	o.MaxBatch = max(1, o.MaxBatch)
	b := &Batcher[Q, R]{o: o, route: route, run: run, undo: undo}
	b.pool.New = func() any { return &Call[Q, R]{done: make(chan struct{}, 1)} }
	b.ctx, b.cancel = context.WithCancel(context.Background())
	queues := 1
	if route != nil {
		queues = o.InFlight
	}
	for range queues {
		b.qs = append(b.qs, make(chan *Call[Q, R], 4*o.MaxBatch))
	}
	for i := range o.InFlight {
		b.wg.Add(1)
		go b.work(b.qs[i%queues])
	}
	return b
}

// Close stops the workers: a call in flight has its context cancelled,
// and requests still queued fail with ErrClosed.
func (b *Batcher[Q, R]) Close() {
	b.cancel()
	b.wg.Wait()
}

// Running is the number of store calls in progress (at most InFlight).
func (b *Batcher[Q, R]) Running() int { return int(b.running.Load()) }

// Queued is the number of requests waiting in the queues (not yet taken
// by a worker).
func (b *Batcher[Q, R]) Queued() int {
	n := 0
	for _, q := range b.qs {
		n += len(q)
	}
	return n
}

// Undone reports how many answers were taken back because their callers
// had left, and how many of those takebacks failed.
func (b *Batcher[Q, R]) Undone() (n, failed int64) { return b.undone.Load(), b.undoFailed.Load() }

// Do queues one request and waits for its answer, or for ctx to end.
func (b *Batcher[Q, R]) Do(ctx context.Context, q Q) (R, error) {
	var zero R
	// A closed batcher answers at once (a select over a send that is
	// ready too would queue the call half of the time).
	if b.ctx.Err() != nil {
		return zero, ErrClosed
	}
	c := b.pool.Get().(*Call[Q, R])
	c.Req, c.ctx = q, ctx
	c.Deadline, _ = ctx.Deadline()
	c.SendBy = SendBy(ctx)
	ch := b.qs[0]
	if b.route != nil {
		ch = b.qs[b.route(q)%uint64(len(b.qs))]
	}
	queued := time.Now()
	select {
	case ch <- c:
	case <-ctx.Done():
		b.recycle(c)
		return zero, ctx.Err()
	case <-b.ctx.Done():
		b.recycle(c)
		return zero, ErrClosed
	}
	// Once queued, c goes back to the pool only after its answer came: a
	// caller that leaves early leaves c to the worker.
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(waiting, left) {
			if !c.sent.Load() {
				// Time spent in drip's own queue is not the store's:
				// say so, for whoever reads the error.
				return zero, fmt.Errorf("%w: waited %v in drip's queue and was never sent to the store (the store's calls in flight were busy)", ctx.Err(), time.Since(queued).Round(time.Millisecond))
			}
			return zero, ctx.Err()
		}
		<-c.done // answered just now
	case <-b.ctx.Done():
		// Closing: the call may have been queued after the workers
		// drained, and then nobody answers it.
		select {
		case <-c.done:
		case <-time.After(time.Second):
			if c.state.CompareAndSwap(waiting, left) {
				return zero, ErrClosed
			}
			<-c.done
		}
	}
	r, err := c.Res, c.Err
	b.recycle(c)
	return r, err
}

func (b *Batcher[Q, R]) recycle(c *Call[Q, R]) {
	c.Req, c.Res, c.Err, c.ctx = *new(Q), *new(R), nil, nil
	c.Deadline, c.SendBy = time.Time{}, time.Time{}
	c.state.Store(waiting)
	c.sent.Store(false)
	b.pool.Put(c)
}

func (b *Batcher[Q, R]) work(q chan *Call[Q, R]) {
	defer b.wg.Done()
	calls := make([]*Call[Q, R], 0, b.o.MaxBatch)
	for {
		calls = calls[:0]
		select {
		case <-b.ctx.Done():
			drain(q)
			return
		case c := <-q:
			calls = append(calls, c)
		}
		calls = b.gather(q, calls)
		b.send(calls)
		clear(calls) // no requests kept alive
		// Let the callers just answered run before gathering the next
		// batch: on a busy process they would otherwise queue their next
		// requests only after this worker had sent a smaller batch
		// without them (measured in BENCHMARKS.md, "yield").
		runtime.Gosched()
	}
}

// gather adds to calls those waiting in q (and with a window, those that
// arrive within it), up to MaxBatch.
func (b *Batcher[Q, R]) gather(q chan *Call[Q, R], calls []*Call[Q, R]) []*Call[Q, R] {
	if b.o.Window <= 0 {
		for len(calls) < b.o.MaxBatch {
			select {
			case c := <-q:
				calls = append(calls, c)
			default:
				return calls
			}
		}
		return calls
	}
	t := time.NewTimer(b.o.Window)
	defer t.Stop()
	for len(calls) < b.o.MaxBatch {
		select {
		case c := <-q:
			calls = append(calls, c)
		case <-t.C:
			return calls
		}
	}
	return calls
}

// send answers the calls whose callers left, and runs the others in one
// call under their latest deadline.
func (b *Batcher[Q, R]) send(calls []*Call[Q, R]) {
	live := calls[:0] // filtered in place
	var latest time.Time
	forever := false
	for _, c := range calls {
		if err := c.ctx.Err(); err != nil {
			c.Err = err
			if !c.answer() {
				b.recycle(c) // never sent: nothing to take back
			}
			continue
		}
		live = append(live, c)
		c.sent.Store(true)
		if c.Deadline.IsZero() {
			forever = true
		} else if c.Deadline.After(latest) {
			latest = c.Deadline
		}
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := b.ctx, context.CancelFunc(func() {})
	if !forever {
		ctx, cancel = context.WithDeadline(b.ctx, latest)
	}
	// Traced callers see the batch's size, and the store's retries.
	ctx = spans.Batch(ctx, len(live), func(i int) context.Context { return live[i].ctx })
	b.running.Add(1)
	b.run(ctx, live)
	b.running.Add(-1)
	cancel()
	var undo []*Call[Q, R]
	for _, c := range live {
		c.ctx = nil
		if c.answer() {
			continue
		}
		// The caller left while the call ran: its answer is nobody's.
		if b.undo != nil && c.Err == nil {
			if q, ok := b.undo(c.Req, c.Res); ok {
				undo = append(undo, &Call[Q, R]{Req: q})
			}
		}
		b.recycle(c)
	}
	if len(undo) > 0 {
		b.takeBack(undo)
	}
}

// takeBack runs the requests that take back answers no caller got, in one
// call under UndoTimeout, from the worker that ran them (for PostgreSQL,
// the queue of their keys).
func (b *Batcher[Q, R]) takeBack(calls []*Call[Q, R]) {
	ctx, cancel := context.WithTimeout(b.ctx, UndoTimeout)
	defer cancel()
	for _, c := range calls {
		c.Deadline, _ = ctx.Deadline()
		c.SendBy = SendBy(ctx)
	}
	b.running.Add(1)
	b.run(ctx, calls)
	b.running.Add(-1)
	for _, c := range calls {
		b.undone.Add(1)
		if c.Err != nil {
			b.undoFailed.Add(1)
		}
	}
}

// drain fails the requests still queued when the batcher closes.
func drain[Q, R any](q chan *Call[Q, R]) {
	for {
		select {
		case c := <-q:
			c.Err = ErrClosed
			c.answer()
		default:
			return
		}
	}
}
