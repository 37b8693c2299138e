package drip

import (
	"context"
	"time"
)

// Prefixed puts Prefix before every key, so that several users of one
// shared store (applications, tenants, test runs) keep their buckets
// apart. A fixed window without Start derives its grid from the key as the
// caller wrote it, so the prefix changes no decision. The prefix counts
// toward MaxKeyLen; one of at most MaxKeyLen/2 bytes leaves room for every
// key a front door builds (FitKey).
type Prefixed struct {
	Store  Store
	Prefix string
}

var _ Store = Prefixed{}

// Apply applies op to the prefixed key.
func (p Prefixed) Apply(ctx context.Context, op Op, at time.Time, r Request) (Decision, error) {
	if r.Key == "" {
		return Decision{}, ErrMissingKey
	}
	return p.Store.Apply(ctx, op, at, p.own(r))
}

// ApplyMulti applies op to the prefixed keys; rs is not modified.
func (p Prefixed) ApplyMulti(ctx context.Context, op Op, at time.Time, rs []Request) (Multi, error) {
	own := make([]Request, len(rs))
	for i, r := range rs {
		if r.Key == "" {
			return Multi{}, ErrMissingKey
		}
		own[i] = p.own(r)
	}
	return p.Store.ApplyMulti(ctx, op, at, own)
}

func (p Prefixed) own(r Request) Request {
	r.Limit = r.Limit.ForKey(r.Key)
	r.Key = p.Prefix + r.Key
	return r
}

// Reset resets the prefixed key.
func (p Prefixed) Reset(ctx context.Context, key string) error {
	if key == "" {
		return ErrMissingKey
	}
	return p.Store.Reset(ctx, p.Prefix+key)
}
