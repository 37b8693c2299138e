package memstore

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/driplimit/drip/store"
)

var _ store.Overrides = (*Store)(nil)

// overrides are the store's per-tenant limits (package override), held
// in process memory: shared by the engines of one process, as its buckets
// are.
type overrides struct {
	mu       sync.Mutex
	m        map[string][]byte
	version  int64
	log      []change // the latest changes, by version, for OverridesSince
	floor    int64    // log holds every change after this version
	watchers map[chan struct{}]struct{}
}

// change is one entry of the record of changes: key changed at version.
type change struct {
	version int64
	key     string
}

// PutOverride implements store.Overrides.
func (s *Store) PutOverride(_ context.Context, key string, val []byte, max int) error {
	o := &s.ov
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.m[key]; !ok && len(o.m) >= max {
		return store.ErrOverridesFull
	}
	if o.m == nil {
		o.m = make(map[string][]byte)
	}
	o.m[key] = append([]byte(nil), val...)
	o.changed(key)
	return nil
}

// DeleteOverride implements store.Overrides.
func (s *Store) DeleteOverride(_ context.Context, key string) (bool, error) {
	o := &s.ov
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.m[key]; !ok {
		return false, nil
	}
	delete(o.m, key)
	o.changed(key)
	return true, nil
}

// OverridesVersion implements store.Overrides.
func (s *Store) OverridesVersion(context.Context) (int64, error) {
	s.ov.mu.Lock()
	defer s.ov.mu.Unlock()
	return s.ov.version, nil
}

// Overrides implements store.Overrides.
func (s *Store) Overrides(context.Context) (int64, map[string][]byte, error) {
	s.ov.mu.Lock()
	defer s.ov.mu.Unlock()
	return s.ov.version, maps.Clone(s.ov.m), nil
}

// OverridesSince implements store.Overrides.
func (s *Store) OverridesSince(_ context.Context, since int64) (int64, map[string][]byte, bool, error) {
	o := &s.ov
	o.mu.Lock()
	defer o.mu.Unlock()
	if since < o.floor || since > o.version {
		return o.version, nil, false, nil
	}
	i, _ := slices.BinarySearchFunc(o.log, since+1, func(c change, v int64) int { return cmp.Compare(c.version, v) })
	changed := make(map[string][]byte)
	for _, c := range o.log[i:] {
		changed[c.key] = o.m[c.key] // nil when deleted; the store's copy, never written again
	}
	return o.version, changed, true, nil
}

// WatchOverrides implements store.Overrides.
func (s *Store) WatchOverrides(ctx context.Context, changed func()) error {
	o := &s.ov
	ch := make(chan struct{}, 1)
	o.mu.Lock()
	if o.watchers == nil {
		o.watchers = make(map[chan struct{}]struct{})
	}
	o.watchers[ch] = struct{}{}
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		delete(o.watchers, ch)
		o.mu.Unlock()
	}()
	changed()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
			changed()
		}
	}
}

// changed bumps the version, records key's change and wakes the
// watchers; o.mu is held. The record keeps the latest KeepChanges at
// least (halved when twice as long: a change costs O(1) on average).
func (o *overrides) changed(key string) {
	o.version++
	o.log = append(o.log, change{o.version, key})
	if len(o.log) > 2*store.KeepChanges {
		drop := len(o.log) - store.KeepChanges
		o.floor = o.log[drop-1].version
		o.log = slices.Clone(o.log[drop:])
	}
	for ch := range o.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
