package storetest

import (
	"errors"
	"testing"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/replay"
)

// TestRandomLinesCoverEdges checks that the random traces every store runs
// (Run's Random and ReplayRandom) include refunds above the burst and
// reservations that can never fit, so that those corners are compared
// with the exact model on every store.
func TestRandomLinesCoverEdges(t *testing.T) {
	for _, tc := range []struct {
		seed uint64
		n    int
	}{{0, 600}, {1000, 400}, {1001, 400}} {
		m := NewModel()
		refunds, neverFit := 0, 0
		for _, l := range RandomLines(tc.seed, tc.n) {
			rs := l.Requests
			if rs == nil {
				rs = []drip.Request{l.Request}
			}
			op, ok := replay.Op(l.Op)
			if !ok {
				continue
			}
			for _, r := range rs {
				if op == bucket.Refund && r.Cost > limBurst(r.Limit) {
					refunds++
				}
				if _, err := m.Prepare(op, r); r.Reserve && errors.Is(err, drip.ErrCostExceedsBurst) {
					neverFit++
				}
			}
		}
		if refunds == 0 || neverFit == 0 {
			t.Errorf("RandomLines(%d, %d): %d refunds above the burst, %d reservations that can never fit; want some of each", tc.seed, tc.n, refunds, neverFit)
		}
	}
}
