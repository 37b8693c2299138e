// Package override holds per-tenant limits set at runtime: a limit that
// replaces a rule's own for one bucket (the rule's name and key values,
// say tenant "acme" on rule "api"), kept in the store every instance
// shares, so that every instance applies it.
//
// A store that keeps overrides has an Overrides side in its capabilities
// (store.Caps: pgstore, redisstore and memstore do). Each instance runs a Follower, which loads every override
// into an immutable Snapshot once, and then, whenever the store's version
// of them changes, reads only the overrides changed since its snapshot's
// version and swaps in a new snapshot that shares everything else with
// the old one: a change costs the same with ten overrides or 100,000. It
// learns of a change at once when the store notifies it (PostgreSQL
// LISTEN/NOTIFY, Redis pub/sub), and within PollEvery otherwise (a
// version check, one small read). Decisions look a bucket key up in the
// snapshot in memory and never call the store for it.
//
// An override changes a bucket's limit, not its key: the bucket keeps its
// state, and its tokens are clamped to the new burst by the next decision
// (bucket.Eval does).
package override

import (
	"context"
	"encoding/json"
	"errors"
	"hash/maphash"
	"slices"
	"strings"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store"
)

// MaxOverrides bounds the overrides a store holds: setting one more (a
// new key) fails with store.ErrOverridesFull.
const MaxOverrides = 100_000

// MaxValueBytes bounds the stored text of one override (its rule, values
// and limit as JSON): keys are at most store.MaxKeyLen bytes, and the
// values they are built from at most as long.
const MaxValueBytes = 4 << 10

// PollEvery is how often a Follower checks the store's version of the
// overrides, whether or not the store notifies changes.
const PollEvery = 500 * time.Millisecond

// LoadTimeout bounds each Refresh of Run: a store that hangs holds up no
// later one.
const LoadTimeout = 5 * time.Second

// Entry is one override: the limit of the bucket Key, the bucket of Rule
// for Values.
type Entry struct {
	Rule    string     `json:"rule"`
	Values  []string   `json:"values"`
	Key     string     `json:"key"`
	Limit   drip.Limit `json:"limit"`
	Updated time.Time  `json:"updated"`
}

// Set stores e in st, by its key.
func Set(ctx context.Context, st store.Overrides, e Entry) error {
	if err := store.CheckKey(e.Key); err != nil {
		return err
	}
	if err := e.Limit.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if len(b) > MaxValueBytes {
		return &store.InputError{Err: errors.New("override over 4 KiB (rule, values and limit together)")}
	}
	return st.PutOverride(ctx, e.Key, b, MaxOverrides)
}

// Snapshot is the overrides at one version, immutable. The nil Snapshot
// holds none.
//
// It is a hash trie of fixed depth: a change copies the three small
// nodes on its key's path and shares every other with the snapshot it
// was made from, so it costs the same however many overrides there are.
type Snapshot struct {
	version int64
	root    *trieRoot
	n       int
	changed []string // the keys that differ from the snapshot before; nil and all: every key may
	all     bool
}

// The trie: 64 ways on each of three levels, by a key's hash (18 bits,
// some 262,000 leaves: at MaxOverrides most hold one entry or none).
type (
	trieRoot [64]*trieMid
	trieMid  [64]*trieLow
	trieLow  [64][]*Entry
)

// seed hashes keys; snapshots live in one process, so any seed does.
var seed = maphash.MakeSeed()

func path(key string) (i, j, k uint64) {
	h := maphash.String(seed, key)
	return h >> 58, h >> 52 & 63, h >> 46 & 63
}

// find is the entry of key in s.
func (s *Snapshot) find(key string) *Entry {
	if s == nil || s.root == nil {
		return nil
	}
	i, j, k := path(key)
	m := s.root[i]
	if m == nil {
		return nil
	}
	l := m[j]
	if l == nil {
		return nil
	}
	for _, e := range l[k] {
		if e.Key == key {
			return e
		}
	}
	return nil
}

// with is s with key's entry set to e (nil: removed), a new snapshot
// sharing all but key's path with s.
func (s *Snapshot) with(key string, e *Entry) *Snapshot {
	out := &Snapshot{}
	var r trieRoot
	if s != nil {
		out.n = s.n
		if s.root != nil {
			r = *s.root
		}
	}
	i, j, k := path(key)
	var m trieMid
	if r[i] != nil {
		m = *r[i]
	}
	var l trieLow
	if m[j] != nil {
		l = *m[j]
	}
	leaf := make([]*Entry, 0, len(l[k])+1)
	found := false
	for _, old := range l[k] {
		if old.Key != key {
			leaf = append(leaf, old)
			continue
		}
		found = true
		if e != nil {
			leaf = append(leaf, e)
		}
	}
	switch {
	case !found && e != nil:
		leaf = append(leaf, e)
		out.n++
	case found && e == nil:
		out.n--
	}
	if len(leaf) == 0 {
		leaf = nil
	}
	l[k] = leaf
	m[j] = &l
	r[i] = &m
	out.root = &r
	return out
}

// Limit is the override of the bucket key, if there is one.
func (s *Snapshot) Limit(key string) (drip.Limit, bool) {
	if s == nil || s.n == 0 {
		return drip.Limit{}, false
	}
	if e := s.find(key); e != nil {
		return e.Limit, true
	}
	return drip.Limit{}, false
}

// Entry is the override of the bucket key, if there is one.
func (s *Snapshot) Entry(key string) (Entry, bool) {
	if e := s.find(key); e != nil {
		return *e, true
	}
	return Entry{}, false
}

// Len is how many overrides s holds.
func (s *Snapshot) Len() int {
	if s == nil {
		return 0
	}
	return s.n
}

// Entries are the overrides, by key: a new slice each call, whose making
// costs as many steps as there are overrides.
func (s *Snapshot) Entries() []Entry {
	if s == nil || s.root == nil {
		return nil
	}
	out := make([]Entry, 0, s.n)
	for _, m := range s.root {
		if m == nil {
			continue
		}
		for _, l := range m {
			if l == nil {
				continue
			}
			for _, leaf := range l {
				for _, e := range leaf {
					out = append(out, *e)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Version is the store's version of the overrides s holds.
func (s *Snapshot) Version() int64 {
	if s == nil {
		return 0
	}
	return s.version
}

// Changed are the keys whose overrides differ in s from the snapshot the
// Follower held before it (set, changed or deleted: Entry says which),
// or all when s was loaded whole (the first load, or a follower too far
// behind the store's record of changes).
func (s *Snapshot) Changed() (keys []string, all bool) {
	if s == nil {
		return nil, true
	}
	return s.changed, s.all
}

// decode is the entry of the stored value v of key k, or nil when it does
// not decode or its limit is not valid (written by something else).
func decode(k string, v []byte) *Entry {
	var e Entry
	if json.Unmarshal(v, &e) != nil || e.Limit.Validate() != nil {
		return nil
	}
	e.Key = k
	return &e
}

// build decodes a store's overrides. A value that does not decode is
// skipped and counted in bad.
func build(version int64, all map[string][]byte) (s *Snapshot, bad int) {
	s = &Snapshot{}
	for k, v := range all {
		e := decode(k, v)
		if e == nil {
			bad++
			continue
		}
		s = s.with(k, e)
	}
	s.version, s.all = version, true
	return s, bad
}

// apply is s with the changes of a store's OverridesSince: a value that
// does not decode removes its key's override, and is counted in bad.
func (s *Snapshot) apply(version int64, changed map[string][]byte) (out *Snapshot, bad int) {
	out = s
	keys := make([]string, 0, len(changed))
	for k, v := range changed {
		var e *Entry
		if v != nil {
			if e = decode(k, v); e == nil {
				bad++
			}
		}
		out = out.with(k, e)
		keys = append(keys, k)
	}
	if out == s { // nothing changed but the version
		out = &Snapshot{root: s.root, n: s.n}
	}
	slices.Sort(keys)
	out.version, out.changed, out.all = version, keys, false
	return out, bad
}
