package memstore

import (
	"strings"
	"sync"
	"unsafe"

	"github.com/driplimit/drip/bucket"
)

// shard is one lock and an open-addressing hash table of slots (linear
// probing; a removal shifts the run after it back, so there are no
// tombstones). A lookup finds the key's hash, key header and bucket in one
// slot, where a Go map would reach the bucket through a second memory
// access; a bucket costs no allocation of its own (a key over 15 bytes
// costs its copy); and eviction looks at slots, not at a map.
type shard struct {
	mu    sync.Mutex
	slots []slot // a power of two long, at most 3/4 full; nil while empty
	n     int    // slots in use
	bytes int    // counted against the bound on bytes
	// leases holds the lease sets of concurrency limits by held key (nil
	// until the first); see leases.go.
	leases *leaseTable
	// windows holds the states of sliding windows by held key (nil until
	// the first); see sliding.go.
	windows map[string]window
	// blocks holds the live blocks of leased tokens by held key (nil
	// until the first); see blocks.go.
	blocks map[string][]bucket.Block
	_      [56]byte // keep shards on separate cache lines
}

// slot is one bucket, the key it is held under and the key's hash (0: the
// slot is free), and the time the bucket is full again (its expiry). A key
// of up to shortKey bytes is held in the slot itself, so that a lookup
// compares it without reaching into memory elsewhere and adding its bucket
// allocates nothing; a longer one is held in long (a copy, which does not
// pin the caller's memory). A slot is 64 bytes, one cache line (checked
// below).
type slot struct {
	hash  uint64
	b     bucket.State
	exp   int64
	long  string
	short [shortKey]byte
	n     uint8 // the length of a key held in short; 0 for a long key
}

const shortKey = 15

func (sl *slot) is(key string) bool {
	if len(key) <= shortKey {
		return int(sl.n) == len(key) && string(sl.short[:sl.n]) == key
	}
	return sl.long == key
}

func (sl *slot) keyLen() int { return int(sl.n) + len(sl.long) }

// size is what a bucket held under a key of n bytes counts against the
// bound on bytes.
func size(n int) int { return BucketBytes + n }

// home is where the search for hash h starts. The low bits of h chose the
// shard; the table uses the bits above them.
func (sh *shard) home(h uint64) int { return int(h>>8) & (len(sh.slots) - 1) }

// find returns the slot holding key (hash h, never 0) and true, or the
// free slot where the search ended and false.
func (sh *shard) find(h uint64, key string) (int, bool) {
	if sh.slots == nil {
		return -1, false
	}
	mask := len(sh.slots) - 1
	for i := sh.home(h); ; i = (i + 1) & mask {
		sl := &sh.slots[i]
		if sl.hash == h && sl.is(key) {
			return i, true
		}
		if sl.hash == 0 {
			return i, false
		}
	}
}

// add puts a bucket under key (hash h), which the shard does not hold,
// into a table with room for it.
func (sh *shard) add(h uint64, key string, b bucket.State, exp int64) {
	sl := slot{hash: h, b: b, exp: exp}
	if len(key) <= shortKey {
		sl.n = uint8(copy(sl.short[:], key))
	} else {
		sl.long = strings.Clone(key)
	}
	sh.place(sl)
}

// place puts sl into a table with room for it.
func (sh *shard) place(sl slot) {
	mask := len(sh.slots) - 1
	i := sh.home(sl.hash)
	for sh.slots[i].hash != 0 {
		i = (i + 1) & mask
	}
	sh.slots[i] = sl
	sh.n++
	sh.bytes += size(sl.keyLen())
}

// full reports whether one more bucket would take the table past 3/4.
func (sh *shard) full() bool { return 4*(sh.n+1) > 3*len(sh.slots) }

// grow doubles the table (or makes its first eight slots).
func (sh *shard) grow() {
	old := sh.slots
	sh.slots = make([]slot, max(8, 2*len(old)))
	sh.n, sh.bytes = 0, 0
	for _, sl := range old {
		if sl.hash != 0 {
			sh.place(sl)
		}
	}
}

// remove frees slot i and shifts back the slots after it whose search
// would otherwise pass the gap.
func (sh *shard) remove(i int) {
	sh.n--
	sh.bytes -= size(sh.slots[i].keyLen())
	mask := len(sh.slots) - 1
	for {
		sh.slots[i] = slot{}
		j := i
		for {
			j = (j + 1) & mask
			if sh.slots[j].hash == 0 {
				return
			}
			// The slot at j may fill the gap at i unless its home lies
			// cyclically in (i, j].
			k := sh.home(sh.slots[j].hash)
			if i <= j && (k <= i || k > j) || i > j && k <= i && k > j {
				break
			}
		}
		sh.slots[i] = sh.slots[j]
		i = j
	}
}

// victim picks the slot to evict for a new key of hash h: among up to
// evictSample buckets from the new key's home on, the first that expired
// by now, else the one that expires first (the bucket nearest to full).
// Keys are placed by hash, so these neighbours are a random sample of the
// shard, and the lookup that found the key missing has just brought them
// into the cache. The shard is not empty.
func (sh *shard) victim(h uint64, now int64) int {
	mask := len(sh.slots) - 1
	v := -1
	for i, seen := sh.home(h), 0; seen < evictSample && seen < sh.n; i = (i + 1) & mask {
		if sh.slots[i].hash == 0 {
			continue
		}
		seen++
		if v < 0 || sh.slots[i].exp < sh.slots[v].exp {
			v = i
		}
		if sh.slots[v].exp <= now {
			break
		}
	}
	return v
}

// A slot fits one cache line.
var _ [64 - unsafe.Sizeof(slot{})]struct{}
