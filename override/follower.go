package override

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip/store"
)

// Follower keeps an instance's snapshot of a store's overrides current.
// Construct it with NewFollower; it is safe for concurrent use.
type Follower struct {
	st       store.Overrides
	log      *slog.Logger
	poll     time.Duration
	noWatch  bool
	onChange func(*Snapshot)
	mu       sync.Mutex // serializes Refresh: snapshots are swapped in version order
	cur      atomic.Pointer[Snapshot]
	lastLog  atomic.Int64
}

// Option configures a Follower.
type Option func(*Follower)

// WithPoll sets how often the version is checked (default PollEvery).
func WithPoll(d time.Duration) Option { return func(f *Follower) { f.poll = d } }

// WithoutWatch turns notifications off: the follower only polls.
func WithoutWatch() Option { return func(f *Follower) { f.noWatch = true } }

// WithLogger sets the logger of load failures (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(f *Follower) { f.log = l } }

// OnChange sets a function called with each new snapshot.
func OnChange(fn func(*Snapshot)) Option { return func(f *Follower) { f.onChange = fn } }

// NewFollower returns a follower of st's overrides, holding none until
// its first Refresh.
func NewFollower(st store.Overrides, opts ...Option) *Follower {
	f := &Follower{st: st, log: slog.Default(), poll: PollEvery}
	for _, o := range opts {
		o(f)
	}
	if f.poll <= 0 {
		f.poll = PollEvery
	}
	return f
}

// Snapshot is the overrides in force.
func (f *Follower) Snapshot() *Snapshot { return f.cur.Load() }

// Refresh brings the snapshot to the store's version of the overrides,
// if it differs from the snapshot's: the first time by loading them all,
// then by applying the changes since (or loading them all again when the
// store cannot tell them). On an error the snapshot stays as it is.
func (f *Follower) Refresh(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.cur.Load()
	v, err := f.st.OverridesVersion(ctx)
	if err != nil {
		return err
	}
	if cur != nil && v == cur.version {
		return nil
	}
	var s *Snapshot
	var bad int
	if cur != nil {
		v, changed, ok, err := f.st.OverridesSince(ctx, cur.version)
		if err != nil {
			return err
		}
		if ok {
			s, bad = cur.apply(v, changed)
		}
	}
	if s == nil {
		v, all, err := f.st.Overrides(ctx)
		if err != nil {
			return err
		}
		s, bad = build(v, all)
	}
	if bad > 0 {
		f.logf("drip: overrides that do not decode were skipped", "count", bad)
	}
	f.cur.Store(s)
	if f.onChange != nil {
		f.onChange(s)
	}
	return nil
}

// Run keeps the snapshot current until ctx ends: it refreshes on every
// notification of the store and every poll interval.
func (f *Follower) Run(ctx context.Context) {
	kick := make(chan struct{}, 1)
	changed := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		defer close(done)
		if f.noWatch {
			return
		}
		for {
			err := f.st.WatchOverrides(ctx, changed)
			if ctx.Err() != nil || errors.Is(err, store.ErrNoWatch) {
				return
			}
			if err != nil {
				f.logf("drip: override notifications lost; polling until they are back", "err", err)
			}
			select { // the polls carry on meanwhile
			case <-ctx.Done():
				return
			case <-time.After(f.poll):
			}
		}
	}()
	t := time.NewTicker(f.poll)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, LoadTimeout)
		if err := f.Refresh(rctx); err != nil && ctx.Err() == nil {
			f.logf("drip: loading overrides failed; the ones in force stay", "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
	}
}

// logf logs at most once a minute, so that an outage does not flood the
// log.
func (f *Follower) logf(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := f.lastLog.Load()
	if now-last < int64(time.Minute) || !f.lastLog.CompareAndSwap(last, now) {
		return
	}
	f.log.Warn(msg, args...)
}
