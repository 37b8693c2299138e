package store

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"math"
	"time"

	"github.com/driplimit/drip/bucket"
)

// MaxAmount bounds costs (and a limit's rates and bursts) so that
// fixed-point values keep headroom in an int64: 1e12 tokens.
const MaxAmount = 1e12

// MaxLeaseLen is the longest lease ID drip accepts, in bytes.
const MaxLeaseLen = 64

// MaxLeaseTTL bounds a concurrency limit's lease TTL: a slot never stays
// taken longer than a day by a holder that is gone.
const MaxLeaseTTL = 24 * time.Hour

// DefaultLeaseTTL is the lease TTL of a concurrency limit without one.
const DefaultLeaseTTL = 30 * time.Second

// MaxInFlight bounds a concurrency limit's slots, so a key's leases are
// bounded state in every store. A lease costs about 130 bytes in memory,
// a row in PostgreSQL, a sorted-set member in Redis. No store's acquire
// or release slows down with the leases held (BENCHMARKS.md).
const MaxInFlight = 1_000_000

// MaxSlidingRate bounds a sliding window's rate, so that its counts stay
// exact in every store's arithmetic (doubles in Redis's scripts).
const MaxSlidingRate = 1e9

// NewLeaseID returns a fresh random lease ID, as CheckLease accepts: 128
// bits from crypto/rand, in 22 characters of unpadded base64url.
func NewLeaseID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Prepare checks one request against its limit's params p
// (drip.Limit.Params) and writes it to it, an item for Store.Apply. It
// checks the key (CheckKey), the op and the cost (Cost), then the lease
// (CheckLease). Bad input gets the same error on every store, before any
// store call, and leaves it as it was. Writing in place spares a hot
// path a copy.
func Prepare(it *bucket.Prepared, op bucket.Op, key string, p *bucket.Params, cost float64, reserve bool, lease string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	c, err := Cost(op, cost, reserve, *p)
	return prepareCost(it, op, key, p, c, err, reserve, lease)
}

// PrepareCost is Prepare for a caller that turned the cost to fixed point
// itself, as Cost does: c, or err for what is wrong with it. A plan that
// holds its params then checks only the key and the lease. It reports
// the first problem as Prepare would.
func PrepareCost(it *bucket.Prepared, op bucket.Op, key string, p *bucket.Params, c int64, err error, reserve bool, lease string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	return prepareCost(it, op, key, p, c, err, reserve, lease)
}

// prepareCost is Prepare after the key's check.
func prepareCost(it *bucket.Prepared, op bucket.Op, key string, p *bucket.Params, c int64, err error, reserve bool, lease string) error {
	if err != nil {
		return err
	}
	if lease != "" || p.Kind == bucket.Concurrency {
		if err := CheckLease(op, lease, *p); err != nil {
			return err
		}
	}
	it.Key, it.Params, it.Cost, it.Reserve, it.Lease = key, *p, c, reserve, lease
	it.Block, it.BlockTTL, it.Leased = "", 0, false
	return nil
}

// CheckDistinct reports ErrNoRequests for no items and ErrDuplicateKey
// for two items of one key: a call of several items must name each key
// once.
func CheckDistinct(items []bucket.Prepared) error {
	if len(items) == 0 {
		return ErrNoRequests
	}
	if len(items) <= 8 {
		// A few keys: compare them, without a map.
		for i := 1; i < len(items); i++ {
			for j := range i {
				if items[i].Key == items[j].Key {
					return fmt.Errorf("requests[%d]: %w (the key of requests[%d])", i, ErrDuplicateKey, j)
				}
			}
		}
		return nil
	}
	seen := make(map[string]int, len(items))
	for i, it := range items {
		if j, dup := seen[it.Key]; dup {
			return fmt.Errorf("requests[%d]: %w (the key of requests[%d])", i, ErrDuplicateKey, j)
		}
		seen[it.Key] = i
	}
	return nil
}

// CheckOp reports ErrInvalidOp for an op that is not Take, Peek or
// Refund.
func CheckOp(op bucket.Op) error {
	switch op {
	case bucket.Take, bucket.Peek, bucket.Refund:
		return nil
	}
	return fmt.Errorf("%w: %v is not take, peek or refund", ErrInvalidOp, op)
}

// Cost checks op and a request's cost against params p, and turns the
// cost to fixed point (bucket.CostMicro). It is the one place an unknown
// op is refused, and the one place a cost is held to the burst.
//
// A take or peek that can never be allowed is an error, not a denial: no
// wait would help. Without reserve, that is a cost above the burst. With
// reserve, it is a cost above the burst plus MaxReserved. A refund takes
// any valid cost; the bucket stays capped at its burst. A concurrency
// limit's lease holds one slot, whatever the cost.
func Cost(op bucket.Op, cost float64, reserve bool, p bucket.Params) (int64, error) {
	// The common case in a few comparisons (NaN fails both); cost says
	// why otherwise.
	// (A reservation on a kind past Window, which takes none, is refused
	// there.)
	if op <= bucket.Refund && cost >= 0 && cost <= MaxAmount && p.Kind != bucket.Concurrency && (!reserve || p.Kind <= bucket.Window) {
		if c := bucket.CostMicro(cost); op == bucket.Refund || c <= p.Burst {
			return c, nil
		}
	}
	return costOf(op, cost, reserve, p)
}

// costOf is Cost in full: each check in its order.
func costOf(op bucket.Op, cost float64, reserve bool, p bucket.Params) (int64, error) {
	if err := CheckOp(op); err != nil {
		return 0, err
	}
	if math.IsNaN(cost) || math.IsInf(cost, 0) || cost < 0 || cost > MaxAmount {
		return 0, fmt.Errorf("%w: %v (must be a finite number from 0 to %g)", ErrInvalidCost, cost, float64(MaxAmount))
	}
	if p.Kind == bucket.Concurrency {
		if reserve {
			return 0, fmt.Errorf("%w: reserve does not apply to a concurrency limit", ErrInvalidCost)
		}
		return bucket.Micro, nil
	}
	if (p.Kind == bucket.Sliding || p.Kind == bucket.Calendar) && reserve {
		return 0, fmt.Errorf("%w: reserve does not apply to a sliding or calendar window", ErrInvalidCost)
	}
	c := bucket.CostMicro(cost)
	return c, checkBurst(op, c, cost, reserve, p)
}

// checkBurst holds a cost of c micro-tokens (cost as written) to p's
// burst: see Cost.
func checkBurst(op bucket.Op, c int64, cost float64, reserve bool, p bucket.Params) error {
	switch {
	case op == bucket.Refund || c <= p.Burst:
	case !reserve:
		return fmt.Errorf("%w: cost %v > burst %v can never succeed without reserve", ErrCostExceedsBurst, cost, float64(p.Burst)/bucket.Micro)
	case p.MaxReserved >= 0 && c-p.Burst > p.MaxReserved:
		return fmt.Errorf("%w: cost %v > burst %v + max_reserved %v can never be reserved", ErrCostExceedsBurst, cost, float64(p.Burst)/bucket.Micro, float64(p.MaxReserved)/bucket.Micro)
	}
	return nil
}

// CheckLease checks a request's lease ID for op under params p. A take or
// refund on a concurrency limit needs one; a peek may name one. Other
// limits take none. IDs are 1 to MaxLeaseLen bytes of printable ASCII,
// as NewLeaseID makes. Prepare calls it.
func CheckLease(op bucket.Op, id string, p bucket.Params) error {
	if p.Kind != bucket.Concurrency {
		if id != "" {
			return fmt.Errorf("%w: a lease applies to a concurrency limit only", ErrInvalidLease)
		}
		return nil
	}
	if id == "" {
		if op == bucket.Peek {
			return nil
		}
		return fmt.Errorf("%w: a %v on a concurrency limit needs a lease", ErrInvalidLease, op)
	}
	if len(id) > MaxLeaseLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidLease, len(id), MaxLeaseLen)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return fmt.Errorf("%w: byte %d is not printable ASCII", ErrInvalidLease, i)
		}
	}
	return nil
}

// PrepareBlock checks a block of leased tokens on key under params p and
// returns it as an item for Store.Apply (bucket.EvalBlocks). op Take
// takes size tokens under the block ID id, to live ttl. op Refund returns
// size unused tokens of block id; it ignores ttl. A block is at most the
// burst, and ttl from one millisecond to bucket.MaxBlockTTL. IDs are as
// lease IDs are (CheckLease). A concurrency limit takes no blocks.
func PrepareBlock(op bucket.Op, key string, p bucket.Params, size int64, id string, ttl time.Duration) (bucket.Prepared, error) {
	if err := CheckKey(key); err != nil {
		return bucket.Prepared{}, err
	}
	switch {
	case p.Kind == bucket.Concurrency:
		return bucket.Prepared{}, fmt.Errorf("%w: a concurrency limit takes no blocks", ErrInvalidBlock)
	case op != bucket.Take && op != bucket.Refund:
		return bucket.Prepared{}, fmt.Errorf("%w: a block is taken or returned, not %v", ErrInvalidBlock, op)
	case size < 0 || (op == bucket.Take && size > p.Burst):
		return bucket.Prepared{}, fmt.Errorf("%w: size %d micro-tokens (burst %d)", ErrInvalidBlock, size, p.Burst)
	case op == bucket.Take && (ttl < time.Millisecond || int64(ttl) > bucket.MaxBlockTTL):
		return bucket.Prepared{}, fmt.Errorf("%w: ttl %v, from 1ms to %v", ErrInvalidBlock, ttl, time.Duration(bucket.MaxBlockTTL))
	}
	if err := CheckLease(op, id, bucket.Params{Kind: bucket.Concurrency}); err != nil {
		return bucket.Prepared{}, fmt.Errorf("%w: id: %w", ErrInvalidBlock, err)
	}
	if op != bucket.Take {
		ttl = 0
	}
	return bucket.Prepared{Key: key, Params: p, Cost: size, Block: id, BlockTTL: int64(ttl), Leased: true}, nil
}
