package memstore

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/driplimit/drip/store"
)

var _ store.Board = (*Store)(nil)

// board is the store's notice board (store.Board), in process memory:
// the instances that share a memory store are the engines of one
// process, so it mostly holds the one instance's own blob.
type board struct {
	mu sync.Mutex
	m  map[string]notice
}

type notice struct {
	blob    []byte
	put     int64 // ns, the store's clock
	expires int64
}

// PutBoard implements store.Board.
func (s *Store) PutBoard(_ context.Context, instance string, blob []byte, ttl time.Duration) error {
	if err := store.CheckNotice(instance, blob, ttl); err != nil {
		return err
	}
	now := s.clock()
	b := &s.board
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expire(now)
	if _, ok := b.m[instance]; !ok && len(b.m) >= store.MaxBoardInstances {
		return store.ErrBoardFull
	}
	if b.m == nil {
		b.m = make(map[string]notice)
	}
	b.m[instance] = notice{append([]byte(nil), blob...), now, now + int64(ttl)}
	return nil
}

// ReadBoard implements store.Board.
func (s *Store) ReadBoard(context.Context) ([]store.Notice, error) {
	now := s.clock()
	b := &s.board
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expire(now)
	out := make([]store.Notice, 0, len(b.m))
	for inst, n := range b.m {
		out = append(out, store.Notice{Instance: inst, Blob: append([]byte(nil), n.blob...), Age: time.Duration(now - n.put)})
	}
	slices.SortFunc(out, func(a, b store.Notice) int { return cmp.Compare(a.Instance, b.Instance) })
	return out, nil
}

// expire drops the blobs expired at now.
func (b *board) expire(now int64) {
	for inst, n := range b.m {
		if n.expires <= now {
			delete(b.m, inst)
		}
	}
}
