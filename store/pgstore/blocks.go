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

// Blocks of leased tokens (package leased) live in their key's own row of
// drip.buckets (migration 8: the columns ids, sizes and exps, NULL for a
// key without blocks), as memstore and redisstore keep them beside the
// bucket: every request on the key, from a leased instance or a plain
// one, marked Leased or not, is held to their cap. A call with a block's
// take or return, or one the plain statements found a key with blocks in
// (errBlocked), is one statement, drip.block_apply (sql/blocks.sql): it
// locks the call's rows in one order, decides every item with the math of
// bucket.EvalMultiAll in plpgsql (eval.sql for each bucket,
// bucket.EvalBlocks' rules around it), and writes all or nothing. It
// returns the state it read, and the Go side decides again from it with
// bucket.EvalMultiAll: the results are Go's, and a disagreement on a
// verdict or on the state written is an error (a bug), as for leases. A
// take marked Leased without a block is a plain take: batched, as any.

// errBlocked is a plain statement's answer for a key whose row holds
// blocks: nothing was decided or written, and the call goes to
// drip.block_apply instead.
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
	states := make([]bucket.State, len(items))
	found := make([]bool, len(items))
	leases := make([]bucket.LeaseSet, len(items))
	bs := make([][]bucket.Block, len(items))
	sqlNext := make([]bucket.State, len(items))
	sqlBlocks := make([]int, len(items))
	allowed := make([]bool, len(items))
	var now int64
	err := s.retry(ctx, func() error {
		rows, err := s.db.Query(ctx, "SELECT * FROM drip.block_apply($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
			int(op), a.keys, a.kinds, a.rates, a.periods, a.bursts, a.maxres, a.starts, a.costs, a.reserves,
			a.leases, blocks, ttls, nanos(at), s.deadline(dl))
		if err != nil {
			return err
		}
		n := 0
		for rows.Next() {
			var ord, nblocks int
			var ids []string
			var sizes, exps []int64
			var ok, present, late bool
			var ls bucket.LeaseSet
			var b, nb bucket.State
			if err := rows.Scan(&ord, &ok, &present, &b.Tokens, &b.TS, &ids, &sizes, &exps, &nb.Tokens, &nb.TS, &nblocks,
				&ls.Live, &ls.Held, &ls.Earliest, &ls.Latest, &now, &late); err != nil {
				rows.Close()
				return err
			}
			if at.IsZero() && n == 0 {
				s.clock.Observe(time.Now(), now) // now is the server's clock
			}
			if late {
				rows.Close()
				return errLate
			}
			if ord != n+1 || n >= len(items) || len(sizes) != len(ids) || len(exps) != len(ids) {
				rows.Close()
				return fmt.Errorf("pgstore: drip.block_apply returned row %d (%d blocks) as row %d of %d", ord, len(ids), n+1, len(items))
			}
			states[n], found[n], leases[n], bs[n] = b, present, ls, nil
			allowed[n], sqlNext[n], sqlBlocks[n] = ok, nb, nblocks
			for j := range ids {
				bs[n] = append(bs[n], bucket.Block{ID: ids[j], Size: sizes[j], Exp: exps[j]})
			}
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n != len(items) {
			return fmt.Errorf("pgstore: drip.block_apply returned %d rows for %d items", n, len(items))
		}
		return nil
	})
	if err != nil {
		return err
	}
	res, next, _, nextBlocks, write := bucket.EvalMultiAll(op, items, states, found, leases, nil, bs, now)
	for i := range items {
		if res[i].Allowed != allowed[i] {
			return fmt.Errorf("pgstore: drip.block_apply and bucket.EvalMultiAll disagree on item %d (a bug): statement allowed=%v, Go allowed=%v", i, allowed[i], res[i].Allowed)
		}
		if write[i] && items[i].Params.Kind != bucket.Concurrency &&
			(next[i] != sqlNext[i] || len(nextBlocks[i]) != sqlBlocks[i]) {
			return fmt.Errorf("pgstore: drip.block_apply and bucket.EvalMultiAll disagree on item %d (a bug): statement wrote %d, %d with %d blocks, Go %d, %d with %d",
				i, sqlNext[i].Tokens, sqlNext[i].TS, sqlBlocks[i], next[i].Tokens, next[i].TS, len(nextBlocks[i]))
		}
	}
	copy(results, res)
	return nil
}
