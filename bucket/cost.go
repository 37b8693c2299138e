package bucket

import "math"

// CostMicro is a cost (or a refund) in micro-tokens, rounded up: a cost
// of 0.0000001 is 1 micro-token, never 0 (which would make it free), and
// 0.0000015 is 2. A cost written with at most six decimals is exact
// (1.1 is 1,100,000). Refunds round up too, so that a refund of the cost a
// take took gives back exactly what it took (store.Separately's undo, Wait
// giving tokens back): rounding one way and the other would leak a
// micro-token at each undo of a fractional cost. cost must be finite and
// in [0, 1e12].
func CostMicro(cost float64) int64 {
	n := int64(math.Round(cost * Micro))
	// n/Micro is the double nearest to n millionths; when cost is above
	// it, cost has a part of a micro-token more, which rounds up.
	if float64(n)/Micro < cost {
		n++
	}
	return n
}
