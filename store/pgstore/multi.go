package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/batch"
	"github.com/driplimit/drip/store"
)

// applyMulti applies items with multi.sql: one statement, all or nothing
// (a key that holds blocks decided under their cap).
func (s *Store) applyMulti(ctx context.Context, op bucket.Op, at time.Time, ps []bucket.Prepared, ds []bucket.Result) error {
	a := newArrays(len(ps))
	seen := make(map[string]bool, len(ps))
	for _, p := range ps {
		k := storeKey(p.Key)
		if seen[string(k)] {
			return fmt.Errorf("%w: two keys hash to the same stored key", store.ErrDuplicateKey)
		}
		seen[string(k)] = true
		a.add(op, k, p, nil)
	}
	dl := batch.SendBy(ctx) // the caller's deadline, less the reply's margin
	if err := s.syncClock(ctx, dl); err != nil {
		return err
	}
	return s.retry(ctx, func() error {
		sql := multiSQL
		if a.sliding {
			sql = multiSlidingSQL
		}
		rows, err := s.db.Query(ctx, sql, int(op), a.keys, a.kinds, a.rates, a.periods,
			a.bursts, a.maxres, a.starts, a.costs, a.reserves, nanos(at), s.deadline(dl), a.leases)
		if err != nil {
			return err
		}
		i := 0
		for rows.Next() {
			var r result
			var ls bucket.LeaseSet
			if err := rows.Scan(&r.allowed, &r.tokens, &r.ts, &r.now, &r.late, &ls.Live, &ls.Held, &ls.Earliest, &ls.Latest, &r.slide.Last, &r.slide.Counts, &r.cap); err != nil {
				rows.Close()
				return err
			}
			if at.IsZero() && i == 0 {
				s.clock.Observe(time.Now(), r.now) // now is the server's clock
			}
			if r.late {
				rows.Close()
				return r.err()
			}
			if i < len(ds) {
				r.leases = ls
				res, err := r.decide(op, ps[i])
				if err != nil {
					rows.Close()
					return err
				}
				ds[i] = res
			}
			i++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if i != len(ds) {
			return fmt.Errorf("pgstore: multi-take returned %d rows for %d requests", i, len(ds))
		}
		return nil
	})
}

// arrays holds requests as one array per field, for multi.sql and
// batch.sql.
type arrays struct {
	ops      []int32
	keys     [][]byte
	kinds    []int32
	rates    []int64
	periods  []int64
	bursts   []int64
	maxres   []int64
	starts   []int64
	costs    []int64
	reserves []bool
	leases   []string // multi.sql: lease IDs of concurrency requests
	ats      []*int64
	dls      []*int64 // batch.sql: deadlines in the server's clock
	// sliding is whether a request is a sliding window: the statement
	// must then be the one with slide.sql (withSliding).
	sliding bool
}

func newArrays(n int) *arrays {
	return &arrays{
		ops: make([]int32, 0, n), keys: make([][]byte, 0, n), kinds: make([]int32, 0, n),
		rates: make([]int64, 0, n), periods: make([]int64, 0, n), bursts: make([]int64, 0, n),
		maxres: make([]int64, 0, n), starts: make([]int64, 0, n), costs: make([]int64, 0, n),
		reserves: make([]bool, 0, n), ats: make([]*int64, 0, n),
	}
}

func (a *arrays) add(op bucket.Op, key []byte, p bucket.Prepared, at *int64) {
	a.ops = append(a.ops, int32(op))
	a.keys = append(a.keys, key)
	a.kinds = append(a.kinds, int32(p.Params.Kind))
	a.rates = append(a.rates, p.Params.Rate)
	a.periods = append(a.periods, p.Params.Period)
	a.bursts = append(a.bursts, p.Params.Burst)
	a.maxres = append(a.maxres, maxres(p.Params))
	a.starts = append(a.starts, start(p.Params))
	a.costs = append(a.costs, p.Cost)
	a.reserves = append(a.reserves, p.Reserve)
	a.leases = append(a.leases, p.Lease)
	a.ats = append(a.ats, at)
	a.sliding = a.sliding || p.Params.Kind == bucket.Sliding
}

// start is what the statements take as a limit's start: for a sliding
// window, its number of slots (slide.sql).
func start(p bucket.Params) int64 {
	if p.Kind == bucket.Sliding {
		return p.Parts
	}
	return p.Start
}

// maxres is what the statements take as a limit's max_reserved: for a
// sliding window, which reserves nothing, the offset of its slot grid
// from the epoch's (slide.sql).
func maxres(p bucket.Params) int64 {
	if p.Kind == bucket.Sliding {
		return p.Sliding().Start
	}
	return p.MaxReserved
}
