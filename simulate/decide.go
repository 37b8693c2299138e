package simulate

import (
	"context"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// decider decides one request at a time on a memory store through the
// store's own interface, as drip.Apply would but allocating nothing: the
// key checked, the limit resolved (once per limit, or per key for a
// window that places its grid by the key), the item prepared, executed
// and answered.
type decider struct {
	ms      *memstore.Store
	items   [1]bucket.Prepared
	results [1]bucket.Result
	last    struct {
		limit  drip.Limit
		key    string
		params bucket.Params
		ok     bool
	}
}

func (d *decider) apply(ctx context.Context, op bucket.Op, at time.Time, r drip.Request) (drip.Decision, error) {
	if err := store.CheckKey(r.Key); err != nil {
		return drip.Decision{}, err
	}
	byKey := r.Limit.Algorithm == drip.FixedWindow && r.Limit.Start == 0
	if !d.last.ok || d.last.limit != r.Limit || (byKey && d.last.key != r.Key) {
		p, err := r.Limit.Params(r.Key)
		if err != nil {
			return drip.Decision{}, err
		}
		d.last.limit, d.last.key, d.last.params, d.last.ok = r.Limit, r.Key, p, true
	}
	if err := store.Prepare(&d.items[0], op, r.Key, &d.last.params, r.Cost, r.Reserve, r.Lease); err != nil {
		return drip.Decision{}, err
	}
	if err := d.ms.Apply(ctx, op, at, d.items[:], d.results[:]); err != nil {
		return drip.Decision{}, err
	}
	return drip.DecisionOf(d.results[0], d.last.params.Burst), nil
}
