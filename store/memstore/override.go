package memstore

import (
	"context"
	"maps"
	"sync"

	"github.com/driplimit/drip/override"
)

var _ override.Store = (*Store)(nil)

// overrides are the store's per-tenant limits (package override), held
// in process memory: shared by the engines of one process, as its buckets
// are.
type overrides struct {
	mu       sync.Mutex
	m        map[string][]byte
	version  int64
	watchers map[chan struct{}]struct{}
}

// PutOverride implements override.Store.
func (s *Store) PutOverride(_ context.Context, key string, val []byte, max int) error {
	o := &s.ov
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.m[key]; !ok && len(o.m) >= max {
		return override.ErrFull
	}
	if o.m == nil {
		o.m = make(map[string][]byte)
	}
	o.m[key] = append([]byte(nil), val...)
	o.changed()
	return nil
}

// DeleteOverride implements override.Store.
func (s *Store) DeleteOverride(_ context.Context, key string) (bool, error) {
	o := &s.ov
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.m[key]; !ok {
		return false, nil
	}
	delete(o.m, key)
	o.changed()
	return true, nil
}

// OverridesVersion implements override.Store.
func (s *Store) OverridesVersion(context.Context) (int64, error) {
	s.ov.mu.Lock()
	defer s.ov.mu.Unlock()
	return s.ov.version, nil
}

// Overrides implements override.Store.
func (s *Store) Overrides(context.Context) (int64, map[string][]byte, error) {
	s.ov.mu.Lock()
	defer s.ov.mu.Unlock()
	return s.ov.version, maps.Clone(s.ov.m), nil
}

// WatchOverrides implements override.Store.
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

// changed bumps the version and wakes the watchers; o.mu is held.
func (o *overrides) changed() {
	o.version++
	for ch := range o.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
