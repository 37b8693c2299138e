package pgstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"runtime"
	"time"

	"github.com/driplimit/drip"
)

// batcher coalesces concurrent single-key decisions into batch.sql
// statements. Each of conns workers has its own queue, and a key always
// goes to the same one (by a hash of the key), so requests for one key are
// never split over statements that would wait on each other's row lock: a
// hot key's requests pile up in one queue and go in one statement. A
// worker takes the first waiting request, gathers more (those already
// waiting, and with a window those that arrive within it) up to max, and
// decides them in one statement. Under light load a request goes alone at
// once; under heavy load, batches form while the workers are busy.
type batcher struct {
	s    *Store
	seed maphash.Seed
	qs   []chan *call
	max  int
	win  time.Duration
}

type call struct {
	op   drip.Op
	key  []byte
	p    drip.Prepared
	at   *int64
	res  result
	err  error
	done chan struct{}
}

var errClosed = errors.New("pgstore: store closed")

func newBatcher(s *Store) *batcher {
	b := &batcher{s: s, seed: maphash.MakeSeed(), max: s.cfg.batchMax, win: s.cfg.batchWindow}
	for range s.cfg.batchConns {
		q := make(chan *call, 4*s.cfg.batchMax)
		b.qs = append(b.qs, q)
		s.wg.Add(1)
		go b.work(q)
	}
	return b
}

// do queues one decision and waits for it. If ctx ends first the request
// may still be decided (and applied) by its batch.
func (b *batcher) do(ctx context.Context, op drip.Op, p drip.Prepared, at *int64) (result, error) {
	// A closed store answers at once (a select over a send that is ready
	// too would queue the call half of the time, and nobody decides it).
	select {
	case <-b.s.stop:
		return result{}, errClosed
	default:
	}
	c := &call{op: op, key: storeKey(p.Key), p: p, at: at, done: make(chan struct{})}
	q := b.qs[maphash.Bytes(b.seed, c.key)%uint64(len(b.qs))]
	select {
	case q <- c:
	case <-ctx.Done():
		return result{}, ctx.Err()
	case <-b.s.stop:
		return result{}, errClosed
	}
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		return result{}, ctx.Err()
	case <-b.s.stop:
		// Closing: the workers may be gone before deciding this one.
		select {
		case <-c.done:
			return c.res, c.err
		case <-time.After(time.Second):
			return result{}, errClosed
		}
	}
}

func (b *batcher) work(q chan *call) {
	defer b.s.wg.Done()
	calls := make([]*call, 0, b.max)
	for {
		calls = calls[:0]
		select {
		case <-b.s.stop:
			drain(q)
			return
		case c := <-q:
			calls = append(calls, c)
		}
		var timeout <-chan time.Time
		var t *time.Timer
		if b.win > 0 {
			t = time.NewTimer(b.win)
			timeout = t.C
		}
	gather:
		for len(calls) < b.max {
			if timeout == nil {
				select {
				case c := <-q:
					calls = append(calls, c)
				default:
					break gather
				}
			} else {
				select {
				case c := <-q:
					calls = append(calls, c)
				case <-timeout:
					break gather
				}
			}
		}
		if t != nil {
			t.Stop()
		}
		b.run(calls)
		// Let the callers just answered run before gathering the next
		// batch: on a busy process they would otherwise queue their next
		// requests only after this worker had sent a smaller batch
		// without them (measured in BENCHMARKS.md, PostgreSQL, "yield").
		runtime.Gosched()
	}
}

// drain fails the requests still queued when the store closes.
func drain(q chan *call) {
	for {
		select {
		case c := <-q:
			c.err = errClosed
			close(c.done)
		default:
			return
		}
	}
}

// run decides calls in one statement and hands each its result. A batch
// of one is decided by the single-request statement, which is lighter.
func (b *batcher) run(calls []*call) {
	if len(calls) == 1 {
		c := calls[0]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c.res, c.err = b.s.applyOne(ctx, c.op, c.p, c.at)
		cancel()
		close(c.done)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := b.s.runBatch(ctx, calls)
	for i, c := range calls {
		if err == nil {
			c.res = res[i]
		}
		c.err = err
		close(c.done)
	}
}

// runBatch decides calls with batch.sql, in one statement.
func (s *Store) runBatch(ctx context.Context, calls []*call) ([]result, error) {
	a := newArrays(len(calls))
	seen := make(map[string]struct{}, len(calls))
	for _, c := range calls {
		a.add(c.op, c.key, c.p, c.at)
		seen[string(c.key)] = struct{}{}
	}
	sql := batchSQL
	if len(seen) == len(calls) {
		sql = batchDistinctSQL
	}
	res := make([]result, len(calls))
	err := s.retry(ctx, func() error {
		rows, err := s.db.Query(ctx, sql, a.ops, a.keys, a.kinds, a.rates, a.periods,
			a.bursts, a.maxres, a.starts, a.costs, a.reserves, a.ats)
		if err != nil {
			return err
		}
		n := 0
		for rows.Next() {
			var i int64
			var r result
			if err := rows.Scan(&i, &r.allowed, &r.tokens, &r.ts, &r.now); err != nil {
				rows.Close()
				return err
			}
			if i < 1 || int(i) > len(res) {
				rows.Close()
				return fmt.Errorf("pgstore: batch returned index %d of %d", i, len(res))
			}
			res[i-1] = r
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n != len(calls) {
			return fmt.Errorf("pgstore: batch returned %d rows for %d requests", n, len(calls))
		}
		return nil
	})
	return res, err
}
