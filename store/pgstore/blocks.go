package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/batch"
	"github.com/driplimit/drip/store"
)

// Blocks of leased tokens (package leased) live in their key's own row
// of drip.buckets (migration 8: the columns ids, sizes and exps, NULL for
// a key without blocks), as memstore and redisstore keep them beside the
// bucket: every request on the key, from a leased instance or a plain
// one, marked Leased or not, is held to their cap. A lone block take or
// return (a leased instance's) goes through the batcher as a plain take
// does: the block calls of a batch are one statement, drip.block_batch
// (sql/blocks.sql), which decides them in order, one key's after one
// another, each with drip.block_step (bucket.EvalBlocks in plpgsql), and
// writes each key once; the plain calls of the batch are batch.sql's, as
// ever. Plain calls on a key with blocks (takes, peeks, multi-takes) are
// decided by the plain statements under the blocks' cap. Without
// batching, and for a call of several items with a block, the call is
// one statement, drip.block_apply: it
// locks the call's rows in one order, decides every item with the math of
// bucket.EvalMultiAll in plpgsql, and writes all or nothing. Both return
// the state each item was decided on, and the Go side decides again from
// it (bucket.EvalBlocks, bucket.EvalMultiAll): the results are Go's, and
// a disagreement on a verdict or on the state written is an error (a
// bug), as for leases. A take marked Leased without a block is a plain
// take: batched, as any.

// errBlocked is a plain statement's answer for a key whose row holds
// blocks when it left the key to drip.block_apply (nothing decided or
// written): the call goes there instead. The Go store's plain statements
// decide such keys themselves; the answer is kept as a safety net.
var errBlocked = errors.New("pgstore: the key holds blocks of leased tokens")

// blockItems reports whether a call holds a block's take or return.
func blockItems(items []bucket.Prepared) bool {
	for i := range items {
		if items[i].Block != "" {
			return true
		}
	}
	return false
}

// applyBlocks decides a call with drip.block_apply, which holds no
// sliding math: a call with a sliding window beside other items (a
// window is never leased itself) is decided item by item, all or nothing
// in the end, and a lone window read a row with blocks as no state.
func (s *Store) applyBlocks(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if slices.ContainsFunc(items, func(it bucket.Prepared) bool { return it.Params.Kind == bucket.Sliding }) {
		return store.Separately{Store: s, Always: true}.Apply(ctx, op, at, items, results)
	}
	return s.blockApply(ctx, op, at, items, results)
}

// blockApply decides a call with drip.block_apply.
func (s *Store) blockApply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	a := newArrays(len(items))
	blocks := make([]string, len(items))
	ttls := make([]int64, len(items))
	seen := make(map[string]bool, len(items))
	for i, p := range items {
		k := storeKey(p.Key)
		if seen[string(k)] {
			return fmt.Errorf("%w: two keys hash to the same stored key", store.ErrDuplicateKey)
		}
		seen[string(k)] = true
		a.add(op, k, p, nil)
		blocks[i], ttls[i] = p.Block, p.BlockTTL
	}
	dl := batch.SendBy(ctx) // the caller's deadline, less the reply's margin
	if err := s.syncClock(ctx, dl); err != nil {
		return err
	}
	var rows []blockRow
	err := s.retry(ctx, func() error {
		var err error
		rows, err = s.blockRows(ctx, len(items), "drip.block_apply", blockApplySQL,
			int(op), a.keys, a.kinds, a.rates, a.periods, a.bursts, a.maxres, a.starts, a.costs, a.reserves,
			a.leases, blocks, ttls, nanos(at), s.deadline(dl))
		if err != nil {
			return err
		}
		if at.IsZero() {
			s.clock.Observe(time.Now(), rows[0].now) // now is the server's clock, late or not
		}
		if rows[0].late {
			return errLate
		}
		return nil
	})
	if err != nil {
		return err
	}
	states := make([]bucket.State, len(items))
	found := make([]bool, len(items))
	leases := make([]bucket.LeaseSet, len(items))
	bs := make([][]bucket.Block, len(items))
	for i, r := range rows {
		states[i], found[i], leases[i], bs[i] = r.state, r.found, r.leases, r.blocks
	}
	now := rows[0].now
	res, next, _, nextBlocks, write := bucket.EvalMultiAll(op, items, states, found, leases, nil, bs, now)
	for i := range items {
		if err := rows[i].agrees("drip.block_apply", i, res[i], next[i], nextBlocks[i], write[i] && items[i].Params.Kind != bucket.Concurrency); err != nil {
			return err
		}
	}
	copy(results, res)
	return nil
}

// blockApplySQL runs drip.block_apply (sql/blocks.sql).
const blockApplySQL = "SELECT * FROM drip.block_apply($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"

// blockBatchSQL runs drip.block_batch (sql/blocks.sql).
const blockBatchSQL = "SELECT * FROM drip.block_batch($1::int[], $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"

// blockRow is one row of drip.block_apply or drip.block_batch: an item's
// verdict, the state it was decided on (its bucket and blocks, or what
// bucket.Leases summarizes of a concurrency limit's leases), the bucket
// and the number of blocks it left, the time and whether it was late.
type blockRow struct {
	allowed bool
	found   bool
	state   bucket.State
	blocks  []bucket.Block
	leases  bucket.LeaseSet
	next    bucket.State
	nblocks int
	now     int64
	late    bool
}

// blockRows runs sql, a statement answering blockRows, and reads its n
// rows, in order.
func (s *Store) blockRows(ctx context.Context, n int, what, sql string, args ...any) ([]blockRow, error) {
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]blockRow, 0, n)
	for rows.Next() {
		var ord int
		var ids []string
		var sizes, exps []int64
		var r blockRow
		if err := rows.Scan(&ord, &r.allowed, &r.found, &r.state.Tokens, &r.state.TS, &ids, &sizes, &exps, &r.next.Tokens, &r.next.TS, &r.nblocks,
			&r.leases.Live, &r.leases.Held, &r.leases.Earliest, &r.leases.Latest, &r.now, &r.late); err != nil {
			return nil, err
		}
		if ord != len(out)+1 || len(out) >= n || len(sizes) != len(ids) || len(exps) != len(ids) {
			return nil, fmt.Errorf("pgstore: %s returned row %d (%d blocks) as row %d of %d", what, ord, len(ids), len(out)+1, n)
		}
		for j := range ids {
			r.blocks = append(r.blocks, bucket.Block{ID: ids[j], Size: sizes[j], Exp: exps[j]})
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) != n {
		return nil, fmt.Errorf("pgstore: %s returned %d rows for %d items", what, len(out), n)
	}
	return out, nil
}

// agrees checks the statement's row of item i against the Go decision
// of it (res, and next with nextBlocks when it writes): a disagreement is
// a bug.
func (r blockRow) agrees(what string, i int, res bucket.Result, next bucket.State, nextBlocks []bucket.Block, write bool) error {
	if res.Allowed != r.allowed {
		return fmt.Errorf("pgstore: %s and Go disagree on item %d (a bug): statement allowed=%v, Go allowed=%v", what, i, r.allowed, res.Allowed)
	}
	if write && (next != r.next || len(nextBlocks) != r.nblocks) {
		return fmt.Errorf("pgstore: %s and Go disagree on item %d (a bug): statement wrote %d, %d with %d blocks, Go %d, %d with %d",
			what, i, r.next.Tokens, r.next.TS, r.nblocks, next.Tokens, next.TS, len(nextBlocks))
	}
	return nil
}

// batchedBlock reports whether a call is a block's take or return that
// goes through the batcher: one item, no sliding window.
func batchedBlock(items []bucket.Prepared) bool {
	return len(items) == 1 && items[0].Block != "" && items[0].Params.Kind != bucket.Sliding
}

// splitBlocks decides the block takes and returns among calls with
// drip.block_batch, in one statement, and returns the others.
func (s *Store) splitBlocks(ctx context.Context, calls []*batch.Call[request, result]) []*batch.Call[request, result] {
	var blocks, others []*batch.Call[request, result]
	for _, c := range calls {
		if c.Req.p.Block != "" {
			blocks = append(blocks, c)
		} else {
			others = append(others, c)
		}
	}
	if len(blocks) == 0 {
		return calls
	}
	err := s.runBlocks(ctx, blocks)
	for _, c := range blocks {
		if err != nil {
			c.Err = err
		}
	}
	return others
}

// runBlocks decides calls, block takes and returns, with
// drip.block_batch: each as drip.block_apply would alone, those of one
// key one after another, in one statement. Go decides each again with
// bucket.EvalBlocks from the state the statement read for it.
func (s *Store) runBlocks(ctx context.Context, calls []*batch.Call[request, result]) error {
	a := newArrays(len(calls))
	blocks := make([]string, len(calls))
	ttls := make([]int64, len(calls))
	for i, c := range calls {
		if err := s.syncClock(ctx, c.Deadline); err != nil {
			return err
		}
		a.add(c.Req.op, c.Req.key, c.Req.p, c.Req.at)
		a.dls = append(a.dls, s.deadline(c.SendBy))
		blocks[i], ttls[i] = c.Req.p.Block, c.Req.p.BlockTTL
	}
	var rows []blockRow
	err := s.retry(ctx, func() error {
		var err error
		rows, err = s.blockRows(ctx, len(calls), "drip.block_batch", blockBatchSQL,
			a.ops, a.keys, a.kinds, a.rates, a.periods, a.bursts, a.maxres, a.starts, a.costs, a.reserves,
			blocks, ttls, a.ats, a.dls)
		return err
	})
	if err != nil {
		return err
	}
	recv := time.Now()
	observed := false
	for i, c := range calls {
		r := rows[i]
		if c.Req.at == nil && !observed { // now is the server's clock
			s.clock.Observe(recv, r.now)
			observed = true
		}
		if r.late {
			c.Res, c.Err = result{late: true}, errLate
			continue
		}
		res, next, nextBlocks, write := bucket.EvalBlocks(c.Req.op, r.state, r.found, r.blocks, &c.Req.p, r.now)
		if c.Err = r.agrees("drip.block_batch", i, res, next, nextBlocks, write); c.Err == nil {
			c.Res = result{allowed: res.Allowed, now: r.now, decided: &res}
		}
	}
	return nil
}
