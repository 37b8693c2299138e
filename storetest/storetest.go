// Package storetest is the conformance suite every store.Store must pass:
// scenario tables over named instants for every rule of docs/semantics.md,
// the replay traces in testdata/ with their golden outputs, concurrency
// bounds, a randomized comparison against an exact rational reference
// model (Model), concurrency limits (RunLeases: leases, their TTL,
// all or nothing beside buckets, 64 concurrent callers, random steps
// against bucket.EvalLeases), multi-takes applied one request at a time
// through store.Separately (RunSeparately), the capabilities and that
// every wrapper forwards them (RunCaps), one key switched between every
// two kinds of limit (RunSwitch), the overrides side
// (RunOverrides), and every kind of limit at the longest periods up to
// the end of int64 nanoseconds (RunExtremes; RunExtremesPast, apart from
// Run, from before 1970). RunTransport is the part of Run that holds a
// store's calls, for a store already held to Run reached another way (over
// TLS, through Sentinel).
//
// A store's tests call Run:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { return newStore(t) })
//	}
//
// Every decision is made with a caller-supplied time, so the suite never
// sleeps, except in the one concurrency test that uses the store's clock.
// Keys are prefixed with a fresh random prefix per test, so a shared server
// may hold state from earlier runs.
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
)

// NewStore returns the store under test. It may return the same store for
// every call (tests use fresh keys); cleanup belongs to t.Cleanup.
type NewStore func(t *testing.T) store.Store

// Option adjusts what Run expects of a store.
type Option func(*config)

type config struct {
	noNotify bool
}

// WithoutOverrideNotifications is for a store whose override
// notifications may never arrive (pgstore behind a pooler in transaction
// mode, where LISTEN does not reach the server): RunOverrides checks its
// overrides without watching them. Followers poll such a store.
func WithoutOverrideNotifications() Option { return func(c *config) { c.noNotify = true } }

// Run runs the whole suite.
func Run(t *testing.T, newStore NewStore, opts ...Option) {
	RunTransport(t, newStore, opts...)
	t.Run("Traces", func(t *testing.T) { RunTraces(t, newStore) })
	t.Run("Random", func(t *testing.T) { RunRandom(t, newStore, 1, 600) })
	t.Run("ReplayRandom", func(t *testing.T) { RunReplayRandom(t, newStore, 2, 400) })
	t.Run("Windows", func(t *testing.T) { RunWindows(t, newStore, 4, 600) })
	t.Run("Calendar", func(t *testing.T) { RunCalendar(t, newStore, 4, 600) })
	t.Run("ReplayWindows", func(t *testing.T) { RunReplayWindows(t, newStore, 2, 300) })
	t.Run("Extremes", func(t *testing.T) { RunExtremes(t, newStore) })
}

// RunTransport runs the parts of Run that hold a store's calls to the
// rules. These are the scenarios of every rule, errors, rounding,
// multi-takes, concurrent callers, concurrency limits, the capabilities,
// a key whose kind of limit changes, overrides and the notice board.
// Call it for a store that another test already holds to all of Run,
// reached here another way: over TLS, through Sentinel, on Redis
// Cluster, through PgBouncer, or through scripts rather than functions.
// The long model comparisons are left out (Traces, Random, Windows,
// Calendar, their replays, Extremes). They send the same calls to the
// same server code as Run does, and take most of its time.
func RunTransport(t *testing.T, newStore NewStore, opts ...Option) {
	t.Run("Scenarios", func(t *testing.T) { RunScenarios(t, newStore) })
	t.Run("Errors", func(t *testing.T) { RunErrors(t, newStore) })
	t.Run("Rounding", func(t *testing.T) { RunRounding(t, newStore) })
	t.Run("Multi", func(t *testing.T) { RunMulti(t, newStore) })
	t.Run("Concurrency", func(t *testing.T) { RunConcurrency(t, newStore) })
	t.Run("Leases", func(t *testing.T) { RunLeases(t, newStore) })
	t.Run("Separately", func(t *testing.T) { RunSeparately(t, newStore) })
	t.Run("Caps", func(t *testing.T) { RunCaps(t, newStore) })
	t.Run("Switch", func(t *testing.T) { RunSwitch(t, newStore) })
	t.Run("Overrides", func(t *testing.T) { RunOverrides(t, newStore, opts...) })
	t.Run("Board", func(t *testing.T) { RunBoard(t, newStore) })
}

// prefix returns a fresh key prefix.
func prefix() string { return testserver.Prefix() }

// base is virtual time zero: the next whole hour, so that virtual times lie
// in the (near) future of the real clock (a shared store's expiry must not
// drop them mid-test) and fixed windows aligned to the epoch open at base.
func base() time.Time { return time.Now().Truncate(time.Hour).Add(time.Hour) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// Apply performs op for the one request r on st, checked and prepared as
// every front door prepares it (drip.Apply): its Decision.
func Apply(ctx context.Context, st store.Store, op bucket.Op, at time.Time, r drip.Request) (drip.Decision, error) {
	m, err := drip.Apply(ctx, st, op, at, r)
	if err != nil {
		return drip.Decision{}, err
	}
	return m.Decisions[0], nil
}
