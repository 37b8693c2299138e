package topkeys

import (
	"cmp"
	"slices"
	"time"
)

// MaxKeyBytes is the most of a key a summary keeps: a longer key is kept
// as its first MaxKeyBytes bytes (and marked Cut); it still counts apart
// from other keys, by the hash of the whole key.
const MaxKeyBytes = 256

// counters are one shard's Space-Saving summary: at most perShard keys,
// each with a count and the most that count may overstate (err: the
// count of the key it replaced). The true count of a listed key is in
// [count-err, count]; a key not listed was counted at most the smallest
// count, once the summary is full. Arrays, so that a decision allocates
// nothing once each counter's key buffer is grown.
type counters struct {
	n     int // counters used
	total uint64
	hash  [perShard]uint64
	count [perShard]uint64
	err   [perShard]uint64
	key   [perShard][]byte
	cut   [perShard]bool
}

// add counts one more for key (h: its hash).
func (c *counters) add(h uint64, key string) {
	c.total++
	kept, cut := keep(key)
	for i := range c.n {
		if c.hash[i] == h && string(c.key[i]) == kept {
			c.count[i]++
			return
		}
	}
	if c.n < perShard {
		c.set(c.n, h, kept, cut, 1, 0)
		c.n++
		return
	}
	m := 0
	for i := 1; i < perShard; i++ {
		if c.count[i] < c.count[m] {
			m = i
		}
	}
	c.set(m, h, kept, cut, c.count[m]+1, c.count[m])
}

func (c *counters) set(i int, h uint64, key string, cut bool, count, err uint64) {
	c.hash[i], c.count[i], c.err[i], c.cut[i] = h, count, err, cut
	if cap(c.key[i]) < len(key) {
		c.key[i] = make([]byte, 0, max(len(key), 48)) // a key's bytes enter here, and only here
	}
	c.key[i] = append(c.key[i][:0], key...)
}

// bound is the most a key not listed was counted.
func (c *counters) bound() uint64 {
	if c.n < perShard {
		return 0
	}
	return slices.Min(c.count[:])
}

func (c *counters) reset() {
	c.n, c.total = 0, 0
}

// keep is what a summary keeps of key.
func keep(key string) (string, bool) {
	if len(key) > MaxKeyBytes {
		return key[:MaxKeyBytes], true
	}
	return key, false
}

// nearest is one shard's keys with the least left relative to their
// limit (the latest decision of each), at most nearPerShard. An interval
// starts with the entries of the one before (carry), so that a key's
// latest decision, near or not, is always the one that counts.
type nearest struct {
	n    int
	at   [nearPerShard]int64 // the interval of the entry's decision
	hash [nearPerShard]uint64
	key  [nearPerShard][]byte
	cut  [nearPerShard]bool
	left [nearPerShard]float64 // tokens / limit
	tok  [nearPerShard]float64
	lim  [nearPerShard]float64
}

// note records that key (h) has tokens left of limit, in interval at.
func (n *nearest) note(at int64, h uint64, key string, tokens, limit float64) {
	left := tokens / limit
	kept, cut := keep(key)
	i := -1
	for j := range n.n {
		if n.hash[j] == h && string(n.key[j]) == kept {
			i = j
			break
		}
	}
	if i < 0 {
		if n.n < nearPerShard {
			i = n.n
			n.n++
		} else {
			i = 0
			for j := 1; j < nearPerShard; j++ {
				if n.left[j] > n.left[i] {
					i = j
				}
			}
			if left >= n.left[i] {
				return
			}
		}
		n.hash[i], n.cut[i] = h, cut
		if cap(n.key[i]) < len(kept) {
			n.key[i] = make([]byte, 0, max(len(kept), 48))
		}
		n.key[i] = append(n.key[i][:0], kept...)
	}
	n.left[i], n.tok[i], n.lim[i], n.at[i] = left, tokens, limit, at
}

// carry starts n with the entries of from (the interval before) noted
// since interval since.
func (n *nearest) carry(from *nearest, since int64) {
	n.n = 0
	for j := range from.n {
		if from.at[j] < since {
			continue
		}
		i := n.n
		n.n++
		n.at[i], n.hash[i], n.cut[i], n.left[i], n.tok[i], n.lim[i] = from.at[j], from.hash[j], from.cut[j], from.left[j], from.tok[j], from.lim[j]
		n.key[i] = append(n.key[i][:0], from.key[j]...)
	}
}

// drop forgets key (h), if listed.
func (n *nearest) drop(h uint64, key string) {
	for j := range n.n {
		if n.hash[j] == h {
			if kept, _ := keep(key); string(n.key[j]) != kept {
				continue
			}
			last := n.n - 1
			n.at[j], n.hash[j], n.cut[j], n.left[j], n.tok[j], n.lim[j] = n.at[last], n.hash[last], n.cut[last], n.left[last], n.tok[last], n.lim[last]
			n.key[j], n.key[last] = n.key[last], n.key[j]
			n.n--
			return
		}
	}
}

// entry is one key of a merged summary.
type entry struct {
	hash       uint64
	key        string
	cut        bool
	count, err uint64
}

// sum is a merged summary: its keys by count (at most Capacity), how many
// it counted in all, and the most a key not listed was counted.
type sum struct {
	entries []entry
	total   uint64
	bound   uint64
	start   time.Time // when its oldest interval began
}

// snapshot is c as a sum (the counters of one shard).
func (c *counters) snapshot(into []entry) []entry {
	for i := range c.n {
		into = append(into, entry{hash: c.hash[i], key: string(c.key[i]), cut: c.cut[i], count: c.count[i], err: c.err[i]})
	}
	return into
}

// merge adds summaries of the same keys over successive intervals: a
// key's count is the sum of its counts, with a summary that does not list
// it adding its bound (to the count and to the error), so that the true
// count stays within [count-err, count]; the Capacity largest are kept,
// and the bound is what a key not kept may have been counted.
func merge(parts ...*sum) *sum {
	out := &sum{}
	idx := make(map[mkey]int)
	var seen []int // the last part that listed each entry
	var bounds uint64
	for pi, p := range parts {
		if p == nil {
			continue
		}
		if out.start.IsZero() || (!p.start.IsZero() && p.start.Before(out.start)) {
			out.start = p.start
		}
		out.total += p.total
		for _, e := range p.entries {
			k := mkey{e.hash, e.key}
			i, ok := idx[k]
			if !ok {
				i = len(out.entries)
				idx[k] = i
				// The parts before this one did not list it.
				out.entries = append(out.entries, entry{hash: e.hash, key: e.key, cut: e.cut, count: bounds, err: bounds})
				seen = append(seen, -1)
			}
			out.entries[i].count += e.count
			out.entries[i].err += e.err
			seen[i] = pi
		}
		if p.bound > 0 { // the keys this part did not list: at most its bound each
			for i := range out.entries {
				if seen[i] != pi {
					out.entries[i].count += p.bound
					out.entries[i].err += p.bound
				}
			}
		}
		bounds += p.bound
	}
	out.bound = bounds
	out.sort()
	if len(out.entries) > Capacity {
		out.bound = max(out.bound, out.entries[Capacity].count)
		out.entries = out.entries[:Capacity]
	}
	return out
}

type mkey struct {
	hash uint64
	key  string
}

func (s *sum) sort() {
	slices.SortStableFunc(s.entries, func(a, b entry) int {
		if c := cmp.Compare(b.count, a.count); c != 0 {
			return c
		}
		return cmp.Compare(a.key, b.key)
	})
}
