package pgstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/batch"
	"github.com/driplimit/drip/store"
)

// Batching says how concurrent single-key decisions (Apply) are coalesced
// into one statement each; the same shape as redisstore.Batching. Its fields
// are Window, MaxBatch and InFlight; WithBatching says what each means.
type Batching = batch.Options

// DefaultBatching is batching unless told otherwise: no window (a batch is
// whatever is waiting when a statement slot frees up), at most 128
// requests a batch, 2 batches in flight. BENCHMARKS.md has the
// measurements behind it.
var DefaultBatching = Batching{Window: 0, MaxBatch: 128, InFlight: 2}

// WithBatching tunes how concurrent single-key decisions (Apply) are
// coalesced into one statement each (sql/batch.sql): up to o.MaxBatch
// requests, gathered for at most o.Window after the first (0: only those
// already waiting, so a lone request waits for nothing), with up to
// o.InFlight batch statements in flight. Zero fields keep
// DefaultBatching's; MaxBatch 1 turns batching off, as WithoutBatching
// does. A batch of one runs the single-request statement. Each key goes to
// one of InFlight queues (by a hash of the key), so requests for one key
// are never split over statements that would wait on each other's row
// lock: a hot key's requests pile up in one queue and go in one statement.
func WithBatching(o Batching) Option {
	return func(c *config) { c.batching = o.Or(DefaultBatching) }
}

// WithoutBatching makes every Apply its own statement.
func WithoutBatching() Option { return func(c *config) { c.batching = Batching{MaxBatch: 1} } }

// request is one Apply waiting in a batch.
type request struct {
	op  bucket.Op
	key []byte
	p   bucket.Prepared
	at  *int64
}

var errClosed = fmt.Errorf("pgstore: %w", batch.ErrClosed)

// errLate is a request the server reached after its caller's deadline: it
// wrote nothing.
var errLate = fmt.Errorf("pgstore: the server reached the request after its deadline and applied nothing: %w", context.DeadlineExceeded)

func newBatcher(s *Store) *batch.Batcher[request, result] {
	seed := maphash.MakeSeed()
	route := func(r request) uint64 { return maphash.Bytes(seed, r.key) }
	return batch.New(s.cfg.batching, route, s.runCalls, undo)
}

// undo is the refund that takes back a take the server applied but whose
// caller had left before the answer came (see package batch): what it
// took goes back, and the caller's error stays true. A take with a lease
// is an acquire or a renewal; its refund releases the lease either way
// (as in redisstore), so a renewal answered with an error may have lost
// its lease.
func undo(q request, r result) (request, bool) {
	if q.op != bucket.Take || !r.allowed || r.late || r.blocked {
		return request{}, false
	}
	q.op = bucket.Refund
	return q, true
}

// runCalls decides calls in one statement and hands each its result. A
// batch of one is decided by the single-request statement, which is
// lighter.
func (s *Store) runCalls(ctx context.Context, calls []*batch.Call[request, result]) {
	if calls = s.splitLeases(ctx, calls); len(calls) == 0 {
		return
	}
	if calls = s.splitBlocks(ctx, calls); len(calls) == 0 {
		return
	}
	if len(calls) == 1 {
		c := calls[0]
		c.Res, c.Err = s.applyOne(ctx, c.Req.op, c.Req.p, c.Req.at, c.SendBy)
		return
	}
	res, err := s.runBatch(ctx, calls)
	if store.IsAnswered(err) {
		// The statement failed on some request's values (a data
		// exception) and rolled back whole: each request is decided
		// alone, in order, so that the others of the batch are decided
		// and only that one fails.
		for _, c := range calls {
			c.Res, c.Err = s.applyOne(ctx, c.Req.op, c.Req.p, c.Req.at, c.SendBy)
		}
		return
	}
	for i, c := range calls {
		if err == nil {
			c.Res, c.Err = res[i], res[i].err()
		} else {
			c.Err = err
		}
	}
}

// runBatch decides calls with batch.sql, in one statement.
func (s *Store) runBatch(ctx context.Context, calls []*batch.Call[request, result]) ([]result, error) {
	for _, c := range calls {
		if err := s.syncClock(ctx, c.Deadline); err != nil {
			return nil, err
		}
	}
	a := newArrays(len(calls))
	seen := make(map[string]struct{}, len(calls))
	for _, c := range calls {
		a.add(c.Req.op, c.Req.key, c.Req.p, c.Req.at)
		a.dls = append(a.dls, s.deadline(c.SendBy))
		seen[string(c.Req.key)] = struct{}{}
	}
	sql := batchSQL
	switch distinct := len(seen) == len(calls); {
	case distinct && a.sliding:
		sql = batchDistinctSlidingSQL
	case distinct:
		sql = batchDistinctSQL
	case a.sliding:
		sql = batchSlidingSQL
	}
	return s.query(ctx, calls, "batch", func(i *int64, r *result) []any {
		return []any{i, &r.allowed, &r.tokens, &r.ts, &r.now, &r.late, &r.slide.Last, &r.slide.Counts, &r.blocked, &r.cap}
	}, sql, a.ops, a.keys, a.kinds, a.rates, a.periods,
		a.bursts, a.maxres, a.starts, a.costs, a.reserves, a.ats, a.dls)
}

// query runs one batch statement for calls: each row is the 1-based index
// of its call and the columns fields names, read into its result. It
// checks that every call has its row, and takes the server's clock from
// the first call decided on it.
func (s *Store) query(ctx context.Context, calls []*batch.Call[request, result], what string, fields func(i *int64, r *result) []any, sql string, args ...any) ([]result, error) {
	res := make([]result, len(calls))
	err := s.retry(ctx, func() error {
		rows, err := s.db.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		n := 0
		for rows.Next() {
			var i int64
			var r result
			if err := rows.Scan(fields(&i, &r)...); err != nil {
				rows.Close()
				return err
			}
			if i < 1 || int(i) > len(res) {
				rows.Close()
				return fmt.Errorf("pgstore: %s returned index %d of %d", what, i, len(res))
			}
			res[i-1] = r
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n != len(calls) {
			return fmt.Errorf("pgstore: %s returned %d rows for %d requests", what, n, len(calls))
		}
		return nil
	})
	if err == nil {
		recv := time.Now()
		for i, c := range calls {
			if c.Req.at == nil { // now is the server's clock
				s.clock.Observe(recv, res[i].now)
				break
			}
		}
	}
	return res, err
}

// splitLeases decides the calls on concurrency limits among calls with
// drip.lease_batch (sql/leases.sql), in one statement, and returns the
// others.
func (s *Store) splitLeases(ctx context.Context, calls []*batch.Call[request, result]) []*batch.Call[request, result] {
	n := 0
	for _, c := range calls {
		if c.Req.p.Params.Kind == bucket.Concurrency {
			n++
		}
	}
	if n == 0 {
		return calls
	}
	leases := make([]*batch.Call[request, result], 0, n)
	others := make([]*batch.Call[request, result], 0, len(calls)-n)
	for _, c := range calls {
		if c.Req.p.Params.Kind == bucket.Concurrency {
			leases = append(leases, c)
		} else {
			others = append(others, c)
		}
	}
	res, err := s.runLeases(ctx, leases)
	for i, c := range leases {
		if err == nil {
			c.Res, c.Err = res[i], res[i].err()
		} else {
			c.Err = err
		}
	}
	return others
}

// leaseBatchSQL runs drip.lease_batch (sql/leases.sql).
const leaseBatchSQL = "SELECT * FROM drip.lease_batch($1::int[], $2::bytea[], $3::bigint[], $4::bigint[], $5::text[], $6::bigint[], $7::bigint[])"

// runLeases decides calls on concurrency limits with drip.lease_batch, in
// one statement.
func (s *Store) runLeases(ctx context.Context, calls []*batch.Call[request, result]) ([]result, error) {
	ops := make([]int32, len(calls))
	keys := make([][]byte, len(calls))
	slots := make([]int64, len(calls))
	periods := make([]int64, len(calls))
	ids := make([]string, len(calls))
	ats := make([]*int64, len(calls))
	dls := make([]*int64, len(calls))
	for i, c := range calls {
		if err := s.syncClock(ctx, c.Deadline); err != nil {
			return nil, err
		}
		ops[i], keys[i], ids[i], ats[i] = int32(c.Req.op), c.Req.key, c.Req.p.Lease, c.Req.at
		slots[i], periods[i] = c.Req.p.Params.Slots(), c.Req.p.Params.Period
		dls[i] = s.deadline(c.SendBy)
	}
	return s.query(ctx, calls, "lease batch", func(i *int64, r *result) []any {
		ls := &r.leases
		return []any{i, &r.allowed, &ls.Live, &ls.Held, &ls.Earliest, &ls.Latest, &r.now, &r.late}
	}, leaseBatchSQL, ops, keys, slots, periods, ids, ats, dls)
}

// deadline is a caller's deadline d in the server's clock (nil: none).
func (s *Store) deadline(d time.Time) *int64 {
	n := s.clock.Deadline(d)
	if n == 0 {
		return nil
	}
	return &n
}

// syncClock reads the server's clock before the first statement that
// carries a deadline d, so that deadlines can be put in its clock (see
// batch.Clock).
func (s *Store) syncClock(ctx context.Context, d time.Time) error {
	if d.IsZero() || s.clock.Known() {
		return nil
	}
	var now int64
	// Through retry, like every statement: behind a transaction-mode
	// pooler it is what switches the query mode (querymode.go).
	if err := s.retry(ctx, func() error {
		return s.db.QueryRow(ctx, "SELECT drip.clock()").Scan(&now)
	}); err != nil {
		return fmt.Errorf("pgstore: reading the server's clock: %w", err)
	}
	s.clock.Observe(time.Now(), now)
	return nil
}

// err is the error of a result the server refused to apply (late), or
// left to drip.block_apply (blocked).
func (r result) err() error {
	switch {
	case r.late:
		return errLate
	case r.blocked:
		return errBlocked
	}
	return nil
}

// CancelAtDeadline makes connections made with c cancel a statement on the
// server when its context ends (a cancel request, then closing the
// connection if the server has not answered within a second). Open's pool
// has it. pgx's default only closes the connection, and a server
// backend waiting on a lock does not notice: it stays, and runs the
// statement once it gets the lock, so under a stalled table every
// deadline would leave one more backend behind. (Late statements write
// nothing either way: they carry their callers' deadlines.) A pool given
// to New should be configured with it too.
func CancelAtDeadline(c *pgx.ConnConfig) {
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &cancelAtDeadline{conn: pc}
	}
}

// cancelAtDeadline is pgx's CancelRequestContextWatcherHandler but for one
// thing: the cancel request runs to its end (the server closing its
// connection), even when the statement returns first. pgx cuts it short
// then, and PgBouncer 1.18 (Debian 12's) exits with "bad client state"
// when a cancel request's client disconnects while it forwards the
// request: the pooler of every client would go down with it.
type cancelAtDeadline struct {
	conn *pgconn.PgConn
	done chan struct{}
}

// cancelRequestTimeout bounds a cancel request; closeDelay is how long a
// statement may go on after its context ended before its connection is
// closed (the cancel has not reached the server, or it did not stop).
const (
	cancelRequestTimeout = 10 * time.Second
	closeDelay           = time.Second
)

func (h *cancelAtDeadline) HandleCancel(context.Context) {
	h.done = make(chan struct{})
	h.conn.Conn().SetDeadline(time.Now().Add(closeDelay))
	go func() {
		defer close(h.done)
		ctx, cancel := context.WithTimeout(context.Background(), cancelRequestTimeout)
		defer cancel()
		_ = h.conn.CancelRequest(ctx)
		// As pgx does: a cancel the server received may not have reached
		// the backend yet; let it land before the connection is reused, or
		// it could cancel the next statement.
		time.Sleep(100 * time.Millisecond)
	}()
}

func (h *cancelAtDeadline) HandleUnwatchAfterCancel() {
	<-h.done
	h.conn.Conn().SetDeadline(time.Time{})
}
