package storetest

import (
	"math/big"
	"slices"
	"time"

	"github.com/driplimit/drip/bucket"
)

// This file is the exact model of leased tokens (docs/semantics.md,
// "Leased tokens"), written from the semantics apart from
// bucket.EvalBlocks: a key's live blocks hold outstanding tokens O, the
// bucket refills only up to burst - O, an expired block leaves O at its
// expiry (before a grid point's refill at the same instant), and a
// returned block leaves O with its unused tokens given back, capped.

// mblock is one live block: its ID, size in tokens and expiry in ns.
type mblock struct {
	id   string
	size *big.Rat
	exp  int64
}

func (m *Model) setBlocks(key string, live []mblock) {
	if len(live) == 0 {
		delete(m.blocks, key)
		return
	}
	m.blocks[key] = live
}

// capOf is l with its burst lowered by the sizes of bs (not below 0).
func capOf(l mlimit, bs []mblock) mlimit {
	c := new(big.Rat).Set(l.burst)
	for _, b := range bs {
		c.Sub(c, b.size)
	}
	if c.Sign() < 0 {
		c.SetInt64(0)
	}
	l.burst = c
	return l
}

// advance is key's bucket at now, brought there through the expiries of
// its blocks in order, each refill under the cap of the blocks live
// then; its live blocks at now, and the limit capped by them.
func (m *Model) advance(key string, l mlimit, now *big.Rat) (tokens, ts *big.Rat, live []mblock, capped mlimit) {
	b, ok := m.buckets[key]
	all := m.blocks[key]
	var done []mblock
	for _, bl := range all {
		if new(big.Rat).SetInt64(bl.exp).Cmp(now) <= 0 {
			done = append(done, bl)
		} else {
			live = append(live, bl)
		}
	}
	slices.SortFunc(done, func(x, y mblock) int { return cmpInt64(x.exp, y.exp) })
	for i, bl := range done {
		t := bl.exp
		if l.kind != bucket.Continuous {
			t-- // the expiry comes before the grid point's refill
		}
		out := append(slices.Clone(live), done[i:]...) // live until t
		tk, tts := stateOf(b, ok, capOf(l, out), new(big.Rat).SetInt64(t))
		b, ok = &modelBucket{tk, tts}, true
	}
	capped = capOf(l, live)
	tokens, ts = stateOf(b, ok, capped, now)
	return tokens, ts, live, capped
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// applyBlock decides a block take or return (p.Block set) on the bucket
// (tokens, ts) at at, whose live blocks are live under the capped limit l.
func (m *Model) applyBlock(op bucket.Op, p bucket.Prepared, l mlimit, tokens, ts *big.Rat, live []mblock, at time.Time, write bool) ModelDecision {
	nowNs := at.UnixNano()
	now := new(big.Rat).SetInt64(nowNs)
	cost := big.NewRat(p.Cost, bucket.Micro)
	d := ModelDecision{Burst: l.burst, Cost: cost, Tokens: tokens, RetryNs: new(big.Rat)}
	i := slices.IndexFunc(live, func(b mblock) bool { return b.id == p.Block })
	if op == bucket.Refund {
		d.Allowed = true
		if i < 0 {
			d.ResetNs = l.until(tokens, ts, l.burst, now)
			return d
		}
		bl := live[i]
		rest := slices.Delete(slices.Clone(live), i, i+1)
		l2 := l
		l2.burst = new(big.Rat).Add(l.burst, bl.size)
		n := minRat(new(big.Rat).Add(tokens, minRat(cost, bl.size)), l2.burst)
		d.Tokens = n
		d.ResetNs = l2.until(n, ts, l2.burst, now)
		if write {
			m.buckets[p.Key] = &modelBucket{n, ts}
			m.setBlocks(p.Key, rest)
		}
		return d
	}
	switch {
	case i >= 0:
		d.Allowed = true
		d.RetryNs = new(big.Rat).SetInt64(live[i].exp - nowNs)
		d.ResetNs = l.until(tokens, ts, l.burst, now)
		return d
	case len(live) >= bucket.MaxBlocks || tokens.Cmp(cost) < 0:
		d.RetryNs = l.until(tokens, ts, cost, now)
		if len(live) >= bucket.MaxBlocks {
			e := live[0].exp
			for _, b := range live {
				e = min(e, b.exp)
			}
			d.RetryNs = new(big.Rat).SetInt64(max(0, e-nowNs))
		}
		d.ResetNs = l.until(tokens, ts, l.burst, now)
		return d
	}
	exp := nowNs + p.BlockTTL
	if l.kind == bucket.Window {
		end := new(big.Rat).Add(ts, l.period)
		if end.Cmp(new(big.Rat).SetInt64(exp)) < 0 {
			exp = floorRat(end).Int64()
		}
	}
	n := new(big.Rat).Sub(tokens, cost)
	after := new(big.Rat).Sub(l.burst, cost)
	d.Allowed, d.Tokens = true, n
	d.RetryNs = new(big.Rat).SetInt64(exp - nowNs)
	d.ResetNs = l.until(n, ts, after, now)
	if write {
		m.buckets[p.Key] = &modelBucket{n, ts}
		m.setBlocks(p.Key, append(slices.Clone(live), mblock{p.Block, cost, exp}))
	}
	return d
}
