package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/batch"
)

// Batching says how concurrent decisions (Apply, multi-takes of up to 16
// keys included) are coalesced into one call each; the same shape as
// pgstore.Batching. Its fields
// are Window, MaxBatch and InFlight; WithBatching says what each means.
type Batching = batch.Options

// DefaultBatching is batching on a standalone server unless told
// otherwise: no window (a batch is whatever is waiting when a worker is
// free), at most 64 requests a call, 2 calls in flight. BENCHMARKS.md has
// the measurements behind it.
var DefaultBatching = Batching{Window: 0, MaxBatch: 64, InFlight: 2}

// WithBatching tunes how concurrent decisions (Apply) are coalesced into
// one call each: up to o.MaxBatch requests, gathered for at
// most o.Window after the first (0: only those already waiting, so a lone
// request waits for nothing), with up to o.InFlight calls in flight. Zero
// fields keep DefaultBatching's; MaxBatch 1 turns batching off, as
// WithoutBatching does. Batching is on by default on a standalone server,
// and off on Redis Cluster (one call's keys must share a slot). Under
// light load a request goes alone at once; under heavy load batches form
// while the calls are in flight. See BENCHMARKS.md.
func WithBatching(o Batching) Option {
	return func(s *Store) { s.batching = o.Or(DefaultBatching) }
}

// WithoutBatching makes every Apply its own call.
func WithoutBatching() Option { return func(s *Store) { s.batching = Batching{MaxBatch: 1} } }

var errClosed = fmt.Errorf("redisstore: %w", batch.ErrClosed)

// errLate is a request the server ran after its caller's deadline: it
// decided and wrote nothing.
var errLate = fmt.Errorf("redisstore: the server ran the request after its deadline and applied nothing: %w", context.DeadlineExceeded)

// request is one Apply waiting in a batch: one item (p), or a
// multi-take's items (ps, a copy of the caller's), decided together, all
// or nothing, in their place in the batch.
type request struct {
	op bucket.Op
	at time.Time
	p  bucket.Prepared
	ps []bucket.Prepared
}

// answer is a request's: the item's result, or a multi-take's results.
type answer struct {
	one  bucket.Result
	many []bucket.Result
}

// maxJoined is the most items of a multi-take that goes in a batch; a
// larger one is a call of its own, so that no batch holds the server for
// long.
const maxJoined = 16

func newBatcher(s *Store) *batch.Batcher[request, answer] {
	return batch.New(s.batching, nil, s.runBatch, undo)
}

// undo is the refund that takes back a take the server applied but whose
// caller had left before the answer came (see package batch): what it
// took goes back, and the caller's error stays true.
//
// A take with a lease is an acquire or a renewal; its refund releases the
// lease either way, so an acquire whose caller left frees its slot at
// once. A renewal answered with an error may thus have lost its lease,
// which docs/semantics.md tells holders to assume of any failed renewal.
//
// A multi-take that was allowed took from every item (all or nothing):
// its refund gives back every item's, together.
func undo(q request, a answer) (request, bool) {
	if q.op != bucket.Take {
		return request{}, false
	}
	if q.ps == nil && !a.one.Allowed {
		return request{}, false
	}
	for _, r := range a.many {
		if !r.Allowed {
			return request{}, false
		}
	}
	q.op = bucket.Refund
	return q, true
}

// buffers are a batch's arguments, reused from one batch to the next.
type buffers struct {
	ops    []bucket.Op
	ats    []time.Time
	dls    []time.Time
	ps     []bucket.Prepared
	joined []bool
}

var bufs = sync.Pool{New: func() any { return new(buffers) }}

// runBatch decides calls in one call of the script in batch mode, each
// request with its own deadline.
//
// The call waits for the server's answer even past ctx's deadline (until
// the store closes, or the client gives up on the connection: rueidis's
// ConnWriteTimeout, 10 s by default), while the callers return at their
// own deadlines. rueidis cannot take back a command once queued: leaving
// it at the deadline would leave it in the pipe with a goroutine waiting
// for its answer, and send the next batch behind it, one more per
// deadline for as long as the server is stalled. Waiting keeps at most
// InFlight batches at a stalled server, and changes nothing in what is
// applied: each request carries its caller's deadline, and the server
// refuses the late ones.
//
// A multi-take's items go in as requests joined to the next (the last
// one not), which the script decides together, all or nothing, as a
// call of their own would (see decide.lua).
func (s *Store) runBatch(ctx context.Context, calls []*batch.Call[request, answer]) {
	for _, c := range calls {
		if c.Deadline.IsZero() || s.clock.Known() {
			continue
		}
		if err := s.syncClock(ctx); err != nil {
			for _, c := range calls {
				c.Err = err
			}
			return
		}
	}
	w := bufs.Get().(*buffers)
	w.ops, w.ats, w.dls, w.ps, w.joined = w.ops[:0], w.ats[:0], w.dls[:0], w.ps[:0], w.joined[:0]
	for _, c := range calls {
		if c.Req.ps == nil {
			w.ops, w.ats, w.ps = append(w.ops, c.Req.op), append(w.ats, c.Req.at), append(w.ps, c.Req.p)
			w.dls, w.joined = append(w.dls, c.SendBy), append(w.joined, false)
			continue
		}
		for i, p := range c.Req.ps {
			w.ops, w.ats, w.ps = append(w.ops, c.Req.op), append(w.ats, c.Req.at), append(w.ps, p)
			w.dls, w.joined = append(w.dls, c.SendBy), append(w.joined, i < len(c.Req.ps)-1)
		}
	}
	rep, err := s.run(s.life, "batch", w.ops, w.ats, w.dls, w.ps, w.joined)
	at := 0 // the call's first request in the batch
	for _, c := range calls {
		switch {
		case err != nil:
			c.Err = err
		case c.Req.ps == nil:
			c.Res.one, c.Err = rep.decide(at, c.Req.op, c.Req.at, c.Req.p)
		default:
			c.Res.many = make([]bucket.Result, len(c.Req.ps))
			c.Err = rep.decideAll(at, c.Req.op, c.Req.at, c.Req.ps, c.Res.many)
		}
		if c.Req.ps == nil {
			at++
		} else {
			at += len(c.Req.ps)
		}
	}
	clear(w.ps) // no keys kept alive
	bufs.Put(w)
}

// syncClock learns the server's clock with TIME, before the first call
// that carries a deadline.
func (s *Store) syncClock(ctx context.Context) error {
	msgs, err := s.c.Do(ctx, s.c.B().Time().Build()).ToArray()
	recv := time.Now()
	if err != nil {
		return fmt.Errorf("redisstore: reading the server's clock: %w", err)
	}
	if len(msgs) != 2 {
		return errors.New("redisstore: TIME: want 2 values")
	}
	sec, err1 := msgs[0].AsInt64()
	usec, err2 := msgs[1].AsInt64()
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("redisstore: TIME: %w", err)
	}
	s.clock.Observe(recv, sec*1e9+usec*1e3)
	return nil
}
