package redisstore

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"

	"github.com/driplimit/drip"
)

// batcher coalesces concurrent single-key decisions into one call in
// batch mode, where each request is decided on its own, in order. Up
// to conns workers each take the first waiting request, add those already
// waiting up to max, and make one call.
type batcher struct {
	s   *Store
	ch  chan *call
	max int
}

type call struct {
	op   drip.Op
	at   time.Time
	p    drip.Prepared
	d    drip.Decision
	err  error
	done chan struct{}
}

var errClosed = errors.New("redisstore: store closed")

func newBatcher(s *Store) *batcher {
	b := &batcher{s: s, ch: make(chan *call, 4*s.batchMax), max: s.batchMax}
	for range s.batchConns {
		s.wg.Add(1)
		go b.work()
	}
	return b
}

// calls recycles calls (each with its done channel): a decision that
// comes back to its caller returns its call here.
var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// do queues one decision and waits for it. If ctx ends first, the request
// may still be decided (and applied) by its batch.
func (b *batcher) do(ctx context.Context, op drip.Op, at time.Time, p drip.Prepared) (drip.Decision, error) {
	// A closed store answers at once (a select over a send that is ready
	// too would queue the call half of the time, and nobody decides it).
	select {
	case <-b.s.stop:
		return drip.Decision{}, errClosed
	default:
	}
	c := calls.Get().(*call)
	c.op, c.at, c.p = op, at, p
	select {
	case b.ch <- c:
	case <-ctx.Done():
		*c = call{done: c.done}
		calls.Put(c)
		return drip.Decision{}, ctx.Err()
	case <-b.s.stop:
		*c = call{done: c.done}
		calls.Put(c)
		return drip.Decision{}, errClosed
	}
	// Once queued, c goes back to the pool only after its answer came:
	// a caller that leaves early leaves c to the worker's send.
	select {
	case <-c.done:
		d, err := c.d, c.err
		*c = call{done: c.done}
		calls.Put(c)
		return d, err
	case <-ctx.Done():
		return drip.Decision{}, ctx.Err()
	case <-b.s.stop:
		// Closing: the call may have been queued after the workers
		// drained, and then nobody decides it.
		select {
		case <-c.done:
			return c.d, c.err
		case <-time.After(time.Second):
			return drip.Decision{}, errClosed
		}
	}
}

func (b *batcher) work() {
	defer b.s.wg.Done()
	w := &batch{calls: make([]*call, 0, b.max)}
	for {
		w.calls = w.calls[:0]
		select {
		case <-b.s.stop:
			b.drain()
			return
		case c := <-b.ch:
			w.calls = append(w.calls, c)
		}
	gather:
		for len(w.calls) < b.max {
			select {
			case c := <-b.ch:
				w.calls = append(w.calls, c)
			default:
				break gather
			}
		}
		b.run(w)
		clear(w.calls)
		// Let the callers just answered run before gathering the next
		// batch: on a busy process they would otherwise queue their next
		// requests only after this worker had sent a smaller batch
		// without them. Larger, fewer calls: measured in BENCHMARKS.md
		// (Redis, "yield").
		runtime.Gosched()
	}
}

// batch is a worker's buffers, reused from one batch to the next.
type batch struct {
	calls []*call
	ops   []drip.Op
	ats   []time.Time
	ps    []drip.Prepared
}

func (b *batcher) run(w *batch) {
	w.ops, w.ats, w.ps = w.ops[:0], w.ats[:0], w.ps[:0]
	for _, c := range w.calls {
		w.ops, w.ats, w.ps = append(w.ops, c.op), append(w.ats, c.at), append(w.ps, c.p)
	}
	// The batch's own deadline: its callers' contexts are theirs alone.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	rep, err := b.s.run(ctx, "batch", w.ops, w.ats, w.ps)
	cancel()
	for i, c := range w.calls {
		if err != nil {
			c.err = err
		} else {
			c.d, c.err = rep.decide(i, c.op, c.at, c.p)
		}
		c.done <- struct{}{}
	}
	clear(w.ps) // no keys kept alive
}

// drain fails the requests still queued when the store closes.
func (b *batcher) drain() {
	for {
		select {
		case c := <-b.ch:
			c.err = errClosed
			c.done <- struct{}{}
		default:
			return
		}
	}
}
