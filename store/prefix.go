package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/driplimit/drip/bucket"
)

// Prefixed puts Prefix before every key, so that several users of one
// shared store (applications, tenants, test runs) keep their buckets, and
// their overrides, apart. Items arrive prepared, a fixed window's grid
// already derived from the key as the caller wrote it, so the prefix
// changes no decision. The prefix counts toward MaxKeyLen; one of at most
// MaxKeyLen/2 bytes leaves room for every key a front door builds
// (FitKey).
type Prefixed struct {
	Store  Store
	Prefix string
}

var _ Store = Prefixed{}

// Apply applies op to the items under their prefixed keys; items is not
// modified.
func (p Prefixed) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	own := make([]bucket.Prepared, len(items))
	for i, it := range items {
		if it.Key == "" {
			return ErrMissingKey
		}
		it.Key = p.Prefix + it.Key
		if err := CheckKey(it.Key); err != nil {
			return err // MaxKeyLen counts the prefix
		}
		own[i] = it
	}
	return p.Store.Apply(ctx, op, at, own, results)
}

// Reset resets the prefixed key.
func (p Prefixed) Reset(ctx context.Context, key string) error {
	if key == "" {
		return ErrMissingKey
	}
	return p.Store.Reset(ctx, p.Prefix+key)
}

// Caps are the store's, its overrides and its board seen under the
// prefix. The fast path would miss the prefix: it is dropped.
func (p Prefixed) Caps() Caps {
	c := p.Store.Caps()
	c.Admit = nil
	if c.Overrides != nil {
		c.Overrides = prefixedOverrides{c.Overrides, p.Prefix}
	}
	if c.Board != nil {
		c.Board = prefixedBoard{c.Board, p.Prefix}
	}
	return c
}

// prefixedBoard keeps the blobs of instances named under a prefix: it
// reads only those, without the prefix.
type prefixedBoard struct {
	in     Board
	prefix string
}

func (p prefixedBoard) PutBoard(ctx context.Context, instance string, blob []byte, ttl time.Duration) error {
	if instance == "" {
		return fmt.Errorf("%w: no instance name", ErrInvalidOp)
	}
	return p.in.PutBoard(ctx, p.prefix+instance, blob, ttl)
}

func (p prefixedBoard) ReadBoard(ctx context.Context) ([]Notice, error) {
	all, err := p.in.ReadBoard(ctx)
	own := all[:0]
	for _, n := range all {
		if inst, ok := strings.CutPrefix(n.Instance, p.prefix); ok {
			n.Instance = inst
			own = append(own, n)
		}
	}
	return own, err
}

// prefixedOverrides keeps the overrides of keys under a prefix, as
// Prefixed keeps their buckets.
type prefixedOverrides struct {
	in     Overrides
	prefix string
}

func (p prefixedOverrides) OverridesVersion(ctx context.Context) (int64, error) {
	return p.in.OverridesVersion(ctx)
}

func (p prefixedOverrides) WatchOverrides(ctx context.Context, changed func()) error {
	return p.in.WatchOverrides(ctx, changed)
}

func (p prefixedOverrides) PutOverride(ctx context.Context, key string, val []byte, max int) error {
	return p.in.PutOverride(ctx, p.prefix+key, val, max)
}

func (p prefixedOverrides) DeleteOverride(ctx context.Context, key string) (bool, error) {
	return p.in.DeleteOverride(ctx, p.prefix+key)
}

func (p prefixedOverrides) Overrides(ctx context.Context) (int64, map[string][]byte, error) {
	v, all, err := p.in.Overrides(ctx)
	if err != nil {
		return 0, nil, err
	}
	return v, p.own(all), nil
}

func (p prefixedOverrides) OverridesSince(ctx context.Context, since int64) (int64, map[string][]byte, bool, error) {
	v, changed, ok, err := p.in.OverridesSince(ctx, since)
	if err != nil || !ok {
		return v, nil, ok, err
	}
	return v, p.own(changed), true, nil
}

// own is the entries of m under the prefix, by their keys without it.
func (p prefixedOverrides) own(m map[string][]byte) map[string][]byte {
	out := make(map[string][]byte)
	for k, val := range m {
		if rest, ok := strings.CutPrefix(k, p.prefix); ok {
			out[rest] = val
		}
	}
	return out
}
