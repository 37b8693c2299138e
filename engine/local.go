package engine

import "github.com/driplimit/drip/store"

// The local fallback of on_error "local": a store of this process, handed
// in (WithLocal), started on first use.

// Close closes the local fallback's store (WithLocal), if one was
// started.
func (e *Engine) Close() error {
	e.localMu.Lock()
	defer e.localMu.Unlock()
	e.closed = true
	return closeStore(e.local)
}

func closeStore(s store.Store) error {
	if c, ok := s.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// localStore is the local fallback's store (WithLocal), started on first
// use; nil without one.
func (e *Engine) localStore() store.Store {
	if e.newLocal == nil {
		return nil
	}
	e.localMu.Lock()
	defer e.localMu.Unlock()
	if e.local == nil {
		e.local = e.newLocal()
		if e.closed { // nothing it runs (a sweeper) may outlive Close
			closeStore(e.local)
		}
	}
	return e.local
}
