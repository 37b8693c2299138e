// Package pending is a store that connects in the background. Until its
// store answers, every call fails as a store that is down fails (with
// ErrNotConnected), so that the callers' fail policies decide (a rule's
// on_error in drip serve); once the store opens, every call goes to it.
//
// drip serve starts on one when its store does not answer at start: a
// store outage then never stops drip from starting, and a rollout during
// an incident does not crash-loop. The open function runs again and
// again, with backoff, until it succeeds; each failure is logged. A
// store whose opening migrates a schema (PostgreSQL's drip_install)
// migrates it in that function, before any call reaches it: no decision
// runs against an unmigrated schema.
package pending

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// ErrNotConnected is the error of every call before the store has opened.
var ErrNotConnected = errors.New("the store has not answered since drip started; connecting in the background")

// OpenFunc opens the store, returning it and what closes it.
type OpenFunc func(ctx context.Context) (store.Store, func(), error)

// Backoff bounds the waits between attempts: the first waits Min, each
// next one twice the last, at most Max, each jittered between half and
// all of it.
type Backoff struct {
	Min, Max time.Duration
}

// DefaultBackoff waits 250 ms after the first failure, at most 10 s.
var DefaultBackoff = Backoff{Min: 250 * time.Millisecond, Max: 10 * time.Second}

// AttemptTimeout bounds one attempt to open the store.
const AttemptTimeout = 30 * time.Second

// Store is a store.Store that connects in the background. It is safe for
// concurrent use. Close it when done: it stops the attempts and closes
// the store once open.
type Store struct {
	caps  store.Caps
	st    atomic.Pointer[opened]
	ready chan struct{} // closed once st is set
	end   context.CancelFunc

	mu     sync.Mutex // orders an open with Close
	closed bool
}

type opened struct {
	st    store.Store
	close func()
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Overrides = (*Store)(nil)
	_ store.Board     = (*Store)(nil)
)

// New returns a store whose calls fail with ErrNotConnected until open
// succeeds, which it tries after a wait (the caller has just tried) and
// again after each failure, waiting as b says, logging every failure to
// log and the success. caps are the capabilities the store will have,
// reported meanwhile and after, but for Overrides and Board: the Store
// serves them itself, and passes them on to the store once open
// (ErrUnsupported if it keeps none).
func New(caps store.Caps, open OpenFunc, b Backoff, log *slog.Logger) *Store {
	ctx, end := context.WithCancel(context.Background())
	s := &Store{caps: caps, ready: make(chan struct{}), end: end}
	s.caps.Overrides, s.caps.Board = s, s
	go s.connect(ctx, open, b, log)
	return s
}

// connect tries open until it succeeds or ctx ends, first after a wait:
// the caller's own attempt has just failed.
func (s *Store) connect(ctx context.Context, open OpenFunc, b Backoff, log *slog.Logger) {
	start := time.Now()
	wait := b.Min
	for attempt := 1; ; attempt++ {
		d := wait/2 + rand.N(wait/2+1) // jittered: instances do not retry in step
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, b.Max)
		actx, cancel := context.WithTimeout(ctx, AttemptTimeout)
		st, closeStore, err := open(actx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("drip serve: the store does not answer yet; each rule's on_error decides meanwhile", "attempt", attempt, "next in", wait.String()+" at most", "err", err.Error())
			continue
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			closeStore()
			return
		}
		s.st.Store(&opened{st, closeStore})
		close(s.ready)
		log.Info("drip serve: the store answers: decisions go to it", "attempts", attempt, "after", time.Since(start).Round(time.Millisecond).String())
		return
	}
}

// Connected reports whether the store has opened.
func (s *Store) Connected() bool { return s.st.Load() != nil }

// Wait waits until the store has opened or ctx ends.
func (s *Store) Wait(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the attempts and closes the store if it opened (or, if
// an attempt is under way and succeeds, once it has).
func (s *Store) Close() error {
	s.end()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		if o := s.st.Load(); o != nil {
			o.close()
		}
	}
	return nil
}

// Apply implements store.Store: the store's, once open.
func (s *Store) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	o := s.st.Load()
	if o == nil {
		return ErrNotConnected
	}
	return o.st.Apply(ctx, op, at, items, results)
}

// Reset implements store.Store: the store's, once open.
func (s *Store) Reset(ctx context.Context, key string) error {
	o := s.st.Load()
	if o == nil {
		return ErrNotConnected
	}
	return o.st.Reset(ctx, key)
}

// Caps implements store.Store: the caps given to New, the same before
// and after the store opens.
func (s *Store) Caps() store.Caps { return s.caps }

// overrides is the open store's side of overrides.
func (s *Store) overrides() (store.Overrides, error) {
	o := s.st.Load()
	if o == nil {
		return nil, ErrNotConnected
	}
	ov := o.st.Caps().Overrides
	if ov == nil {
		return nil, store.ErrUnsupported
	}
	return ov, nil
}

// PutOverride implements store.Overrides: the store's, once open.
func (s *Store) PutOverride(ctx context.Context, key string, val []byte, max int) error {
	ov, err := s.overrides()
	if err != nil {
		return err
	}
	return ov.PutOverride(ctx, key, val, max)
}

// DeleteOverride implements store.Overrides: the store's, once open.
func (s *Store) DeleteOverride(ctx context.Context, key string) (bool, error) {
	ov, err := s.overrides()
	if err != nil {
		return false, err
	}
	return ov.DeleteOverride(ctx, key)
}

// OverridesVersion implements store.Overrides: the store's, once open.
func (s *Store) OverridesVersion(ctx context.Context) (int64, error) {
	ov, err := s.overrides()
	if err != nil {
		return 0, err
	}
	return ov.OverridesVersion(ctx)
}

// Overrides implements store.Overrides: the store's, once open.
func (s *Store) Overrides(ctx context.Context) (int64, map[string][]byte, error) {
	ov, err := s.overrides()
	if err != nil {
		return 0, nil, err
	}
	return ov.Overrides(ctx)
}

// OverridesSince implements store.Overrides: the store's, once open.
func (s *Store) OverridesSince(ctx context.Context, since int64) (int64, map[string][]byte, bool, error) {
	ov, err := s.overrides()
	if err != nil {
		return 0, nil, false, err
	}
	return ov.OverridesSince(ctx, since)
}

// WatchOverrides implements store.Overrides: it waits until the store is
// open (or ctx ends), then watches the store's.
func (s *Store) WatchOverrides(ctx context.Context, changed func()) error {
	if err := s.Wait(ctx); err != nil {
		return err
	}
	ov, err := s.overrides()
	if err != nil {
		return err
	}
	return ov.WatchOverrides(ctx, changed)
}

// PutBoard implements store.Board: the store's, once open.
func (s *Store) PutBoard(ctx context.Context, instance string, blob []byte, ttl time.Duration) error {
	o := s.st.Load()
	if o == nil {
		return ErrNotConnected
	}
	b := o.st.Caps().Board
	if b == nil {
		return store.ErrUnsupported
	}
	return b.PutBoard(ctx, instance, blob, ttl)
}

// ReadBoard implements store.Board: the store's, once open.
func (s *Store) ReadBoard(ctx context.Context) ([]store.Notice, error) {
	o := s.st.Load()
	if o == nil {
		return nil, ErrNotConnected
	}
	b := o.st.Caps().Board
	if b == nil {
		return nil, store.ErrUnsupported
	}
	return b.ReadBoard(ctx)
}
