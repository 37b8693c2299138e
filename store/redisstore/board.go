package redisstore

import (
	"cmp"
	"context"
	_ "embed"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/driplimit/drip/store"
)

// The notice board (store.Board) lives in two hashes that share a hash
// tag, {prefix board} (each instance's blob) and {prefix board}:times
// (when it was put and expires, by the server's clock), written and read
// by one script (board.lua), which drops the expired instances; both
// keys expire with the last instance.

var _ store.Board = (*Store)(nil)

//go:embed board.lua
var boardLua string

var boardScript = rueidis.NewLuaScript(boardLua)

func (s *Store) boardKeys() []string {
	tag := "{" + s.prefix + "board}"
	return []string{tag, tag + ":times"}
}

// PutBoard implements store.Board.
func (s *Store) PutBoard(ctx context.Context, instance string, blob []byte, ttl time.Duration) error {
	if err := store.CheckNotice(instance, blob, ttl); err != nil {
		return err
	}
	n, err := boardScript.Exec(ctx, s.c, s.boardKeys(), []string{"put", instance, string(blob),
		strconv.FormatInt(max(1, ttl.Milliseconds()), 10), strconv.Itoa(store.MaxBoardInstances)}).AsInt64()
	if err == nil && n < 0 {
		err = store.ErrBoardFull
	}
	return err
}

// ReadBoard implements store.Board.
func (s *Store) ReadBoard(ctx context.Context) ([]store.Notice, error) {
	vs, err := boardScript.Exec(ctx, s.c, s.boardKeys(), []string{"read"}).ToArray()
	if err != nil {
		return nil, err
	}
	if len(vs)%3 != 0 {
		return nil, fmt.Errorf("redisstore: the board's answer has %d values", len(vs))
	}
	out := make([]store.Notice, 0, len(vs)/3)
	for i := 0; i < len(vs); i += 3 {
		inst, err := vs[i].ToString()
		if err != nil {
			return nil, err
		}
		age, err := vs[i+1].AsInt64()
		if err != nil {
			return nil, err
		}
		blob, err := vs[i+2].ToString()
		if err != nil {
			return nil, err
		}
		out = append(out, store.Notice{Instance: inst, Blob: []byte(blob), Age: time.Duration(age) * time.Millisecond})
	}
	slices.SortFunc(out, func(a, b store.Notice) int { return cmp.Compare(a.Instance, b.Instance) })
	return out, nil
}
