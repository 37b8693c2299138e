package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/driplimit/drip"
)

// batcher coalesces concurrent single-key decisions into one script call
// in batch mode, where each request is decided on its own, in order. Up
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

// do queues one decision and waits for it. If ctx ends first, the request
// may still be decided (and applied) by its batch.
func (b *batcher) do(ctx context.Context, op drip.Op, at time.Time, p drip.Prepared) (drip.Decision, error) {
	c := &call{op: op, at: at, p: p, done: make(chan struct{})}
	select {
	case b.ch <- c:
	case <-ctx.Done():
		return drip.Decision{}, ctx.Err()
	case <-b.s.stop:
		return drip.Decision{}, errClosed
	}
	select {
	case <-c.done:
		return c.d, c.err
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
	calls := make([]*call, 0, b.max)
	for {
		calls = calls[:0]
		select {
		case <-b.s.stop:
			b.drain()
			return
		case c := <-b.ch:
			calls = append(calls, c)
		}
	gather:
		for len(calls) < b.max {
			select {
			case c := <-b.ch:
				calls = append(calls, c)
			default:
				break gather
			}
		}
		b.run(calls)
	}
}

func (b *batcher) run(calls []*call) {
	ops := make([]drip.Op, len(calls))
	ats := make([]time.Time, len(calls))
	ps := make([]drip.Prepared, len(calls))
	for i, c := range calls {
		ops[i], ats[i], ps[i] = c.op, c.at, c.p
	}
	// The batch's own deadline: its callers' contexts are theirs alone.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	rep, err := b.s.run(ctx, "batch", ops, ats, ps)
	cancel()
	for i, c := range calls {
		if err != nil {
			c.err = err
		} else {
			c.d, c.err = rep.decide(i, c.op, c.at, c.p)
		}
		close(c.done)
	}
}

// drain fails the requests still queued when the store closes.
func (b *batcher) drain() {
	for {
		select {
		case c := <-b.ch:
			c.err = errClosed
			close(c.done)
		default:
			return
		}
	}
}
