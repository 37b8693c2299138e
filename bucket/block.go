package bucket

import (
	"slices"
	"time"
)

// This file is the math of leased tokens (docs/semantics.md, "Leased
// tokens"): an instance takes a block of a bucket's tokens under a block
// ID, grants from it in its own process, and returns what it did not use.
// A key then holds, beside its State, its live blocks, and their sum, the
// outstanding tokens O. The invariant that keeps the shared limit exact is
//
//	tokens + O <= Burst
//
// at every instant: while blocks are out, the bucket refills only up to
// Burst - O, so the tokens sitting in blocks count as if they were still in
// the bucket. (Were the bucket to refill to Burst meanwhile, the tokens of
// a block granted late plus the refill would exceed Burst + Rate*T in some
// window.) A block that expires leaves O at its expiry, its tokens counted
// as granted; a block returned leaves O and its unused tokens go back to
// the bucket, capped. Token buckets and fixed windows only: a concurrency
// limit takes no blocks.
//
// The decision is a pure function of (State, blocks, params, now, item),
// EvalBlocks; the exact model in storetest follows the same rules in
// rational arithmetic.

// MaxBlocks is the most live blocks one key holds: a block take beyond
// them is denied (the instance then takes per decision). One instance
// holds one block of a key at a time, so this bounds the instances that
// lease one key at once, and the state a key costs a store.
const MaxBlocks = 64

// MaxBlockTTL is the longest life a block may ask for.
const MaxBlockTTL = int64(time.Minute)

// Block is one block of leased tokens: Size micro-tokens taken under ID,
// live while now < Exp (nanoseconds).
type Block struct {
	ID   string
	Size int64
	Exp  int64
}

// Outstanding is the sum of the sizes of the blocks bs live at now.
func Outstanding(bs []Block, now int64) int64 {
	var o int64
	for _, b := range bs {
		if b.Exp > now {
			o += b.Size
		}
	}
	return o
}

// BlocksExpireAt is when the blocks bs have all expired (0 for none).
func BlocksExpireAt(bs []Block) int64 {
	var latest int64
	for _, b := range bs {
		latest = max(latest, b.Exp)
	}
	return latest
}

// capped is p with its Burst lowered by the outstanding tokens o (not
// below 0): the most the bucket may refill to while o is out.
func (p Params) capped(o int64) Params {
	p.Burst = max(0, p.Burst-o)
	return p
}

// Advance brings the state b (found: whether the key had state) of a key
// with blocks bs forward to now through the expiries of its blocks: up to
// each expiry the bucket refills under the cap of the blocks then live,
// and after it under the cap without that block. For interval refills and
// fixed windows an expiry at a grid point comes before that point's
// refill (a block of a fixed window expires at its window's end, and the
// next window opens on the whole burst). It returns the state, whether
// the key has state, the blocks still live at now (a new slice, or bs
// when none expired) and the params capped by them.
func (p Params) Advance(b State, found bool, bs []Block, now int64) (State, bool, []Block, Params) {
	var o int64
	expired := 0
	for _, bl := range bs {
		o += bl.Size
		if bl.Exp <= now {
			expired++
		}
	}
	q := p.capped(o)
	if expired == 0 {
		return b, found, bs, q
	}
	done := make([]Block, 0, expired)
	live := make([]Block, 0, len(bs)-expired)
	for _, bl := range bs {
		if bl.Exp <= now {
			done = append(done, bl)
		} else {
			live = append(live, bl)
		}
	}
	slices.SortFunc(done, func(x, y Block) int { return cmpInt(x.Exp, y.Exp) })
	for _, bl := range done {
		t := bl.Exp
		if p.Kind != Continuous {
			t-- // before the grid point's refill
		}
		_, b, _ = Eval(Refund, b, found, q, 0, false, t)
		found = true
		o -= bl.Size
		q = p.capped(o)
	}
	return b, found, live, q
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// BlockExp is the expiry of a block taken at now with a life of ttl from
// the bucket b (refilled to now): now + ttl, and for a fixed window no
// later than the end of b's window (the window of its TS, which is after
// now when the clock went back into the previous one).
func (p Params) BlockExp(b State, now, ttl int64) int64 {
	exp := now + ttl
	if p.Kind == Window {
		exp = min(exp, b.TS+p.Period)
	}
	return exp
}

// EvalBlocks decides the item it at now on a key whose state is b (found:
// whether it had state) and whose blocks are bs. It returns the result,
// the state and the blocks to store, and whether they must be written.
//
// An item without a Block is a plain take, peek or refund, decided by
// Eval under the cap of the live blocks. With a Block:
//
//   - Take takes a block of it.Cost under the ID it.Block, live for
//     it.BlockTTL (for a fixed window, no longer than its window): a take
//     as Eval decides it, which adds the block. The result's RetryAfter
//     is then the block's life from now (the taker stops granting from it
//     sooner: see docs/semantics.md). A take under an ID already live
//     changes nothing and is allowed, reporting that block's remaining
//     life; a take while MaxBlocks are live is denied.
//   - Refund returns the block it.Block with it.Cost of its tokens unused
//     (at most its size): the block leaves the outstanding tokens and the
//     unused ones go back to the bucket, capped. Returning a block that is
//     not live (expired, returned already, unknown) changes nothing.
//   - Peek is a plain peek.
func EvalBlocks(op Op, b State, found bool, bs []Block, it *Prepared, now int64) (Result, State, []Block, bool) {
	b, found, live, q := it.Params.Advance(b, found, bs, now)
	if it.Block == "" || op == Peek {
		r, n, w := Eval(op, b, found, q, it.Cost, it.Reserve, now)
		return r, n, live, w
	}
	i := slices.IndexFunc(live, func(bl Block) bool { return bl.ID == it.Block })
	switch op {
	case Take:
		switch {
		case i >= 0:
			r, n, _ := Eval(Peek, b, found, q, 0, false, now)
			r.RetryAfter = untilAt(live[i].Exp, now)
			return r, n, live, false
		case len(live) >= MaxBlocks:
			r, n, _ := Eval(Peek, b, found, q, it.Cost, false, now)
			r.Allowed = false
			r.RetryAfter = untilAt(earliest(live), now)
			return r, n, live, false
		}
		r, n, w := Eval(Take, b, found, q, it.Cost, false, now)
		if !w {
			return r, n, live, false
		}
		exp := it.Params.BlockExp(n, now, it.BlockTTL)
		next := make([]Block, len(live), len(live)+1)
		copy(next, live)
		next = append(next, Block{ID: it.Block, Size: it.Cost, Exp: exp})
		r.RetryAfter = untilAt(exp, now)
		q.Burst -= it.Cost
		r.ResetAfter = q.Until(n, q.Burst, now)
		return r, n, next, true
	case Refund:
		r, n, _ := Eval(Refund, b, found, q, 0, false, now)
		if i < 0 {
			return r, n, live, false
		}
		bl := live[i]
		next := make([]Block, 0, len(live)-1)
		next = append(append(next, live[:i]...), live[i+1:]...)
		q.Burst += bl.Size
		n.Tokens = min(q.Burst, n.Tokens+min(it.Cost, bl.Size))
		r.Tokens = n.Tokens
		r.ResetAfter = q.Until(n, q.Burst, now)
		return r, n, next, true
	}
	return Result{}, b, live, false
}

func earliest(bs []Block) int64 {
	var e int64
	for i, b := range bs {
		if i == 0 || b.Exp < e {
			e = b.Exp
		}
	}
	return e
}

// StateExpiresAt is when a key's state b and its blocks bs carry no more
// information, so a store may drop them together: once every block has
// expired and the bucket, refilled under their caps until then, is full
// again (ExpiresAt). A store must not drop expired blocks before then
// while it keeps the state: the state would refill as if they had never
// capped it.
func (p Params) StateExpiresAt(b State, bs []Block) int64 {
	if len(bs) == 0 {
		return p.ExpiresAt(b)
	}
	last := BlocksExpireAt(bs)
	a, _, _, _ := p.Advance(b, true, bs, last)
	return max(last, p.ExpiresAt(a))
}
