package server

import (
	"fmt"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// check refuses bad input before the engine is called, as drip.Apply
// would (the same errors, with the index of the request when there are
// of a multi-take): for requests the engine decides in parts (Server.apply),
// so that none is decided when one is bad.
func check(op bucket.Op, rs []drip.Request, multi bool) error {
	var one [1]bucket.Prepared // the single request's, without an allocation
	items := one[:]
	if len(rs) != 1 {
		items = make([]bucket.Prepared, len(rs))
	}
	for i, r := range rs {
		err := store.CheckKey(r.Key)
		var p bucket.Params
		if err == nil {
			p, err = r.Limit.Params(r.Key)
		}
		if err == nil {
			err = store.Prepare(&items[i], op, r.Key, &p, r.Cost, r.Reserve, r.Lease)
		}
		if err != nil {
			if multi {
				err = fmt.Errorf("requests[%d]: %w", i, err)
			}
			return err
		}
	}
	return store.CheckDistinct(items)
}
