// Package store is the kit of store writers. It holds the Store
// interface every store implements (memstore, pgstore, redisstore) and
// its capabilities (Caps). Prepare, Cost, CheckKey and CheckLease turn a
// request into a checked item of package bucket; the errors are theirs.
//
// Wrappers change what reaches a store. Prefixed and Sharded change
// keys. Separately takes several keys one by one. Denials repeats a
// denial the store proved, without a store call.
//
// A user of drip meets this package only to wrap a store. A
// drip.Limiter checks and prepares every request; the store gets
// checked, fixed-point items.
//
// It imports the standard library and package bucket only.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/driplimit/drip/bucket"
)

// Store holds bucket state and executes prepared items, each call one
// atomic step.
//
// Apply performs op on items and writes each item's result to results
// (len(results) == len(items)). A take of several items is all or
// nothing. If any item is denied, none is applied, and each result says
// what that item alone would have got. The caller has checked every item
// (Prepare) and their keys' distinctness (CheckDistinct). A store checks
// nothing again. A store keeps neither items nor results after it
// returns.
//
// A zero at means the store's own clock; a shared store uses its
// server's, so instances with skewed clocks agree. Any other value is the
// time of the decision, as tests and replays supply.
//
// Reset deletes the bucket (or the leases) of key: it is full again. It
// checks key itself (CheckKey).
//
// Caps says what the store can do; every wrapper forwards its store's.
//
// Implementations must be safe for concurrent use and pass storetest.Run.
type Store interface {
	Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error
	Reset(ctx context.Context, key string) error
	Caps() Caps
}

// Admitter is a store's in-process fast path (Caps.Admit): one item
// decided without the slices of Apply. The memory store has one.
//
// Admit takes cost micro-tokens from key's bucket under p. p is a token
// bucket or a fixed window; cost is within its burst (Cost made it). It
// reports whether the take was allowed, as Apply of that Take would.
//
// ApplyOne is Apply of one item, without reserve limits on p's kind: a
// token bucket or a fixed window, checked as Prepare checks it.
//
// key has passed CheckKey. A zero at is the store's clock.
type Admitter interface {
	Admit(key string, p *bucket.Params, cost int64, at time.Time) bool
	ApplyOne(op bucket.Op, key string, p *bucket.Params, cost int64, reserve bool, at time.Time) bucket.Result
}

// Caps is what a store can do beyond executing items.
type Caps struct {
	// Name is the store's kind: "memstore", "pgstore", "redisstore".
	// Traces name the store by it. Wrappers forward it.
	Name string
	// Admit is the store's in-process fast path, or nil. Wrappers that
	// change keys (Prefixed, Sharded) drop it.
	Admit Admitter
	// InProcess reports that the store decides in the caller's process,
	// as the memory store does. Callers then give its calls no deadline
	// of their own, which saves a timer.
	InProcess bool
	// SplitsKeys reports that a call on several keys may fail with
	// ErrNotColocated: the store cannot take them in one atomic step,
	// like Redis Cluster across hash slots. Separately then takes them one
	// by one.
	SplitsKeys bool
	// Leases reports that the store holds the leases of concurrency limits
	// (bucket.Concurrency items).
	Leases bool
	// Sliding reports that the store holds sliding windows (bucket.Sliding
	// items), and Calendar calendar windows (bucket.Calendar items). A
	// store without them refuses such items with ErrUnsupported
	// (CheckKinds).
	Sliding, Calendar bool
	// Blocks reports that the store holds blocks of leased tokens, as
	// package leased needs (bucket.EvalBlocks). A key's blocks cap every
	// take of the key.
	Blocks bool
	// Overrides is the store's side that keeps per-tenant limits (package
	// override), or nil when it keeps none.
	Overrides Overrides
	// Board is the store's notice board, where each instance sharing the
	// store keeps one small blob for the others to read (the fleet's top
	// keys, package topkeys), or nil when it keeps none.
	Board Board
}

// Board keeps one blob per instance, shared by every instance that uses
// the store. Each is dropped ttl after it was last put, so an instance
// that stops drops out.
type Board interface {
	// PutBoard sets instance's blob for ttl. The bounds are MaxBoardBlob,
	// MaxBoardInstance and MaxBoardTTL. It fails with ErrBoardFull when
	// instance is new and MaxBoardInstances have a blob already.
	PutBoard(ctx context.Context, instance string, blob []byte, ttl time.Duration) error
	// ReadBoard returns every instance's unexpired blob (at most
	// MaxBoardInstances), with how long ago it was put by the store's
	// clock.
	ReadBoard(ctx context.Context) ([]Notice, error)
}

// Notice is one instance's blob on a Board.
type Notice struct {
	Instance string
	Blob     []byte
	Age      time.Duration
}

// Bounds of a Board.
const (
	MaxBoardBlob      = 1 << 20
	MaxBoardInstance  = 128
	MaxBoardInstances = 256
	MaxBoardTTL       = time.Hour
)

// ErrBoardFull is the error of putting the blob of a new instance on a
// Board that holds MaxBoardInstances already.
var ErrBoardFull = errors.New("the board holds as many instances as it may")

// CheckNotice checks the arguments of Board.PutBoard.
func CheckNotice(instance string, blob []byte, ttl time.Duration) error {
	switch {
	case instance == "" || len(instance) > MaxBoardInstance:
		return fmt.Errorf("%w: instance name of %d bytes (1 to %d)", ErrInvalidOp, len(instance), MaxBoardInstance)
	case len(blob) > MaxBoardBlob:
		return fmt.Errorf("%w: a board blob of %d bytes (at most %d)", ErrInvalidOp, len(blob), MaxBoardBlob)
	case ttl < time.Millisecond || ttl > MaxBoardTTL:
		return fmt.Errorf("%w: a board ttl of %v (1ms to %v)", ErrInvalidOp, ttl, MaxBoardTTL)
	}
	return nil
}

// Overrides keeps overrides (package override), by bucket key, as opaque
// values, shared by every instance that uses the store. Every change
// bumps a version number that only grows.
type Overrides interface {
	// PutOverride sets the value of key. It fails with ErrOverridesFull
	// when key is new and the store holds max values already. The bound
	// counts the whole store, every prefix included.
	PutOverride(ctx context.Context, key string, val []byte, max int) error
	// DeleteOverride removes key's value, reporting whether it had one.
	DeleteOverride(ctx context.Context, key string) (bool, error)
	// OverridesVersion is the version of the overrides: it changes
	// whenever one is set or deleted.
	OverridesVersion(ctx context.Context) (int64, error)
	// Overrides returns every override, and a version that is at most
	// theirs (it is read first).
	Overrides(ctx context.Context) (int64, map[string][]byte, error)
	// OverridesSince returns the overrides changed after version since,
	// and the version they lead to, read together. A deleted override has
	// a nil value. ok is false when the store cannot tell what changed:
	// its record (KeepChanges long) does not reach since, or since is not
	// its version. The caller then loads them all.
	OverridesSince(ctx context.Context, since int64) (version int64, changed map[string][]byte, ok bool, err error)
	// WatchOverrides calls changed after each change, and once when it is
	// listening, until ctx ends or the notifications stop (an error; the
	// caller watches again later). A store that cannot notify returns
	// ErrNoWatch at once.
	WatchOverrides(ctx context.Context, changed func()) error
}

// Errors of bad input, returned (wrapped, with details) by the checks of
// this package, so that every store refuses bad input the same way before
// any state is touched. drip re-exports those its users check.
var (
	ErrInvalidLimit     = errors.New("invalid limit")
	ErrMissingKey       = errors.New("missing key")
	ErrKeyTooLong       = errors.New("key too long")
	ErrInvalidCost      = errors.New("invalid cost")
	ErrCostExceedsBurst = errors.New("cost exceeds burst")
	ErrInvalidLease     = errors.New("invalid lease")
	ErrInvalidBlock     = errors.New("invalid block")
	ErrInvalidOp        = errors.New("invalid op")
	ErrNoRequests       = errors.New("no requests")
	// ErrUnsupported is returned (wrapped) by a store given an item of a
	// kind it cannot hold (see Caps).
	ErrUnsupported  = errors.New("not supported by this store")
	ErrDuplicateKey = errors.New("duplicate key in multi-take")
	// ErrNotColocated is returned (wrapped) by a store that cannot apply
	// the keys of one call in a single atomic step, such as Redis Cluster
	// when the keys hash to different slots (Caps.SplitsKeys). It is about
	// the keys, not a failing store: Separately falls back to separate
	// takes.
	ErrNotColocated = errors.New("keys cannot be applied in one atomic step")
)

// CheckKinds reports ErrUnsupported when items hold a sliding window and
// c has no Sliding, or a calendar window and c has no Calendar. A store
// that holds neither calls it.
func CheckKinds(items []bucket.Prepared, c Caps) error {
	for i := range items {
		switch k := items[i].Params.Kind; {
		case k == bucket.Sliding && !c.Sliding:
			return fmt.Errorf("%w: sliding_window (key %q)", ErrUnsupported, items[i].Key)
		case k == bucket.Calendar && !c.Calendar:
			return fmt.Errorf("%w: a calendar period (key %q)", ErrUnsupported, items[i].Key)
		}
	}
	return nil
}

// KeepChanges is how many of the latest override changes a store
// records, for OverridesSince. A follower further behind loads every
// override.
const KeepChanges = 4096

// Errors of the overrides side.
var (
	// ErrOverridesFull is the error of setting a new override when the
	// store holds the most it may already.
	ErrOverridesFull = errors.New("too many overrides")
	// ErrNoWatch is the error of Overrides.WatchOverrides for a store that
	// cannot notify changes: a follower then only polls.
	ErrNoWatch = errors.New("the store cannot notify override changes")
)
