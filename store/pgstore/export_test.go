package pgstore

import (
	"context"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/batch"
	"github.com/driplimit/drip/store"
)

// ApplyBatch decides rs (with ops and times) in one batch.sql statement,
// in order, as the batcher would: for tests of batch.sql itself.
func ApplyBatch(ctx context.Context, s *Store, ops []bucket.Op, rs []drip.Request, ats []time.Time) ([]drip.Decision, []error) {
	errs := make([]error, len(rs))
	var calls []*batch.Call[request, result]
	var idx []int
	var ps []bucket.Prepared
	for i, r := range rs {
		params, err := r.Limit.Params(r.Key)
		var p bucket.Prepared
		if err == nil {
			err = store.Prepare(&p, ops[i], r.Key, &params, r.Cost, r.Reserve, r.Lease)
		}
		if err != nil {
			errs[i] = err
			continue
		}
		calls = append(calls, &batch.Call[request, result]{Req: request{ops[i], storeKey(p.Key), p, nanos(ats[i])}})
		idx = append(idx, i)
		ps = append(ps, p)
	}
	ds := make([]drip.Decision, len(rs))
	if len(calls) == 0 {
		return ds, errs
	}
	res, err := s.runBatch(ctx, calls)
	for j, i := range idx {
		if err != nil {
			errs[i] = err
			continue
		}
		if errs[i] = res[j].err(); errs[i] == nil {
			var r bucket.Result
			if r, errs[i] = res[j].decide(ops[i], ps[j]); errs[i] == nil {
				ds[i] = drip.DecisionOf(r, ps[j].Params.Burst)
			}
		}
	}
	return ds, errs
}

// StoreKey is the key's bytes as the table holds them.
func StoreKey(key string) []byte { return storeKey(key) }

// Migrations is the schema's migrations, in order: for the test of the
// migration of leases to rows.
var Migrations = migration

// ApplyCalls decides single-item calls (ops, items, times) as one batch
// of the batcher, in order: block takes and returns with them.
func ApplyCalls(ctx context.Context, s *Store, ops []bucket.Op, items []bucket.Prepared, ats []time.Time) ([]bucket.Result, []error) {
	calls := make([]*batch.Call[request, result], len(items))
	for i, p := range items {
		calls[i] = &batch.Call[request, result]{Req: request{ops[i], storeKey(p.Key), p, nanos(ats[i])}}
	}
	s.runCalls(ctx, calls)
	res := make([]bucket.Result, len(items))
	errs := make([]error, len(items))
	for i, c := range calls {
		if errs[i] = c.Err; errs[i] == nil {
			res[i], errs[i] = c.Res.decide(ops[i], items[i])
		}
	}
	return res, errs
}
