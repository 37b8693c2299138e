package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/spans"
)

// Leased limits (bucket.Prepared.Leased, package leased) keep their state
// apart from other buckets: under the key with BlocksSuffix, a string of
// decimal integers separated by spaces, "tokens ts id size exp id size
// exp ..." (micro-tokens, nanoseconds; the live blocks of the key, see
// bucket.EvalBlocks). A call on leased items reads them with the server's
// TIME in one script (blocks_read.lua), decides in Go with
// bucket.EvalMultiAll, and writes the new values in a second script
// only if none changed since it read them (blocks_write.lua); a call that
// finds a value changed reads and decides again after a random backoff,
// up to blockTries times.
// That is two round trips per decision instead of one, and retries under
// contention: leased limits call the store once per block, not per
// decision, so the cost is paid rarely. (A Lua version of
// bucket.EvalBlocks, one round trip, is not written yet.)

// BlocksSuffix follows the key of a leased limit's state in Redis.
const BlocksSuffix = "#leased"

const blockTries = 32

// ErrContended is returned when a call on leased items found its keys
// changed by other callers blockTries times in a row.
var ErrContended = errors.New("redisstore: leased keys changed under every try")

var (
	//go:embed blocks_read.lua
	blocksReadLua string
	//go:embed blocks_write.lua
	blocksWriteLua string

	blocksRead  = rueidis.NewLuaScript(blocksReadLua)
	blocksWrite = rueidis.NewLuaScript(blocksWriteLua)
)

// leasedItems reports whether a call is one of leased items.
func leasedItems(items []bucket.Prepared) bool {
	for i := range items {
		if items[i].Leased || items[i].Block != "" {
			return true
		}
	}
	return false
}

// applyBlocks decides a call of leased items (a concurrency item among
// them is refused: package leased never sends one marked).
func (s *Store) applyBlocks(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	keys := make([]string, len(items))
	for i := range items {
		if items[i].Params.Kind == bucket.Concurrency {
			return fmt.Errorf("redisstore: a concurrency limit is not leased")
		}
		keys[i] = s.prefix + items[i].Key + BlocksSuffix
		if s.cluster && i > 0 && Slot(keys[i]) != Slot(keys[0]) {
			return fmt.Errorf("%w (%q and %q differ)", ErrCrossSlot, items[0].Key, items[i].Key)
		}
	}
	states := make([]bucket.State, len(items))
	found := make([]bool, len(items))
	blocks := make([][]bucket.Block, len(items))
	for try := range blockTries {
		if try > 0 {
			spans.Retry(ctx, try, "changed")
			// Changed under us: back off a random while, growing, so
			// that contending callers spread out.
			d := time.Duration(rand.Int64N(int64(min(time.Millisecond, 20*time.Microsecond<<min(try, 10)))))
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		msgs, err := blocksRead.Exec(ctx, s.c, keys, nil).ToArray()
		if err != nil {
			return fmt.Errorf("redisstore: %w", err)
		}
		if len(msgs) != 2+len(keys) {
			return fmt.Errorf("redisstore: %d values in a reply for %d keys", len(msgs), len(keys))
		}
		sec, err1 := msgs[0].ToString()
		usec, err2 := msgs[1].ToString()
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("redisstore: TIME: %w", err)
		}
		now := at.UnixNano()
		if at.IsZero() {
			s, err1 := strconv.ParseInt(sec, 10, 64)
			u, err2 := strconv.ParseInt(usec, 10, 64)
			if err := errors.Join(err1, err2); err != nil {
				return fmt.Errorf("redisstore: TIME: %w", err)
			}
			now = s*1e9 + u*1e3
		}
		old := make([]string, len(keys))
		for i := range keys {
			if old[i], err = msgs[2+i].ToString(); err != nil {
				return fmt.Errorf("redisstore: %w", err)
			}
			if states[i], found[i], blocks[i], err = decodeBlocks(old[i]); err != nil {
				return fmt.Errorf("redisstore: %s: %w", items[i].Key, err)
			}
		}
		res, next, _, nextBlocks, write := bucket.EvalMultiAll(op, items, states, found, nil, nil, blocks, now)
		args := make([]string, 0, 3*len(keys))
		args = append(args, old...)
		any := false
		for i := range items {
			if !write[i] {
				args = append(args, "", "")
				continue
			}
			any = true
			exp := items[i].Params.StateExpiresAt(next[i], nextBlocks[i])
			ttl := max(int64(1), (exp-now)/1e6) + time.Minute.Milliseconds()
			args = append(args, encodeBlocks(next[i], nextBlocks[i]), strconv.FormatInt(ttl, 10))
		}
		if !any {
			copy(results, res)
			return nil
		}
		ok, err := blocksWrite.Exec(ctx, s.c, keys, args).AsInt64()
		if err != nil {
			return fmt.Errorf("redisstore: %w", err)
		}
		if ok == 1 {
			copy(results, res)
			return nil
		}
	}
	return ErrContended
}

func encodeBlocks(b bucket.State, bs []bucket.Block) string {
	var sb strings.Builder
	sb.WriteString(strconv.FormatInt(b.Tokens, 10))
	sb.WriteByte(' ')
	sb.WriteString(strconv.FormatInt(b.TS, 10))
	for _, bl := range bs {
		sb.WriteByte(' ')
		sb.WriteString(bl.ID)
		sb.WriteByte(' ')
		sb.WriteString(strconv.FormatInt(bl.Size, 10))
		sb.WriteByte(' ')
		sb.WriteString(strconv.FormatInt(bl.Exp, 10))
	}
	return sb.String()
}

func decodeBlocks(v string) (bucket.State, bool, []bucket.Block, error) {
	if v == "" {
		return bucket.State{}, false, nil, nil
	}
	f := strings.Fields(v)
	if len(f) < 2 || (len(f)-2)%3 != 0 || len(f) > 2+3*bucket.MaxBlocks {
		return bucket.State{}, false, nil, fmt.Errorf("bad leased state %q", v)
	}
	var err error
	num := func(s string) int64 {
		n, e := strconv.ParseInt(s, 10, 64)
		if e != nil && err == nil {
			err = e
		}
		return n
	}
	b := bucket.State{Tokens: num(f[0]), TS: num(f[1])}
	var bs []bucket.Block
	for i := 2; i < len(f); i += 3 {
		bs = append(bs, bucket.Block{ID: f[i], Size: num(f[i+1]), Exp: num(f[i+2])})
	}
	if err != nil {
		return bucket.State{}, false, nil, fmt.Errorf("bad leased state %q: %w", v, err)
	}
	return b, true, bs, nil
}
