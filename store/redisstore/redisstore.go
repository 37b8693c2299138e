// Package redisstore keeps drip's buckets in Redis or Redis Cluster (and
// Valkey), through github.com/redis/rueidis.
//
// Every decision is one script call (EVALSHA, falling back to EVAL when
// the server's script cache is empty, after a restart or a failover): the
// script reads the bucket, decides and writes in one atomic step, with the
// server's clock (TIME) unless the caller supplies a time. A multi-take is
// one call over all its keys, all-or-nothing. Concurrent calls share
// connections through rueidis's auto-pipelining.
//
// State is exact: one key per bucket holding "tokens ts" as decimal
// integers (micro-tokens, nanoseconds), and the script does its
// arithmetic in exact integers (bigint.lua), so decisions are the ones
// drip.Eval makes, bit for bit. A full bucket is no key at all; any other
// carries a TTL a little past the moment it is full again, so idle
// buckets vanish.
//
// Redis Cluster: all keys of a multi-take must hash to one slot. Put the
// part they share in braces, a hash tag: "{tenant-7}:user:42" and
// "{tenant-7}" hash alike (see Tag). A multi-take whose keys do not share
// a slot fails with ErrCrossSlot before anything is sent. MOVED, ASK and
// failovers are followed by the client.
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/driplimit/drip"
)

//go:embed bigint.lua
var bigintLua string

//go:embed decide.lua
var decideLua string

// decideScript is the one script every decision runs; no script text is
// ever built from input.
var decideScript = rueidis.NewLuaScript(bigintLua + "\n" + decideLua)

// ErrCrossSlot is returned for a multi-take on Redis Cluster whose keys do
// not all hash to one slot.
var ErrCrossSlot = errors.New("redisstore: keys of a multi-take must share a hash slot on Redis Cluster; give them a common hash tag, e.g. {tenant}:user:1 and {tenant}")

// DefaultPrefix is put before every key unless WithPrefix says otherwise.
const DefaultPrefix = "drip:"

// Store is a drip.Store on Redis. It is safe for concurrent use.
type Store struct {
	c       rueidis.Client
	prefix  string
	cluster bool
	owned   bool
}

var _ drip.Store = (*Store)(nil)

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the string put before every key (default "drip:"). It
// must not contain '{': a hash tag belongs in the keys.
func WithPrefix(p string) Option { return func(s *Store) { s.prefix = p } }

// New returns a store on a client the caller already has (standalone,
// cluster or sentinel). Close does not close c.
func New(c rueidis.Client, opts ...Option) *Store {
	s := &Store{c: c, prefix: DefaultPrefix, cluster: c.Mode() == rueidis.ClientModeCluster}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Open connects to the server a URL names: redis://[user:pass@]host:port[/db]
// or rediss:// for TLS. The same URL pointed at one node of a cluster
// reaches the whole cluster; more seed nodes go in ?addr=host:port
// (repeatable). Close closes the connection.
func Open(url string, opts ...Option) (*Store, error) {
	o, err := rueidis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	c, err := rueidis.NewClient(o)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	s := New(c, opts...)
	s.owned = true
	return s, nil
}

// Client is the store's client.
func (s *Store) Client() rueidis.Client { return s.c }

// Close closes the client if Open made it.
func (s *Store) Close() error {
	if s.owned {
		s.c.Close()
	}
	return nil
}

// Tag returns key under the hash tag tag, "{tag}:key": keys with the same
// tag land in the same Redis Cluster slot, so a multi-take can span them.
func Tag(tag, key string) string { return "{" + tag + "}:" + key }

// Apply implements drip.Store.
func (s *Store) Apply(ctx context.Context, op drip.Op, at time.Time, r drip.Request) (drip.Decision, error) {
	p, err := drip.Prepare(r)
	if err != nil {
		return drip.Decision{}, err
	}
	ps := []drip.Prepared{p}
	st, err := s.run(ctx, op, at, ps)
	if err != nil {
		return drip.Decision{}, err
	}
	b, found := st.bucket(0)
	d, next, write := drip.Eval(op, b, found, p.Params, p.Cost, p.Reserve, st.now)
	if err := st.check(0, d.Allowed, next, write); err != nil {
		return drip.Decision{}, err
	}
	return d, nil
}

// ApplyMulti implements drip.Store.
func (s *Store) ApplyMulti(ctx context.Context, op drip.Op, at time.Time, rs []drip.Request) (drip.Multi, error) {
	ps, err := drip.PrepareMulti(rs)
	if err != nil {
		return drip.Multi{}, err
	}
	if s.cluster {
		slot := Slot(s.prefix + ps[0].Key)
		for _, p := range ps[1:] {
			if Slot(s.prefix+p.Key) != slot {
				return drip.Multi{}, fmt.Errorf("%w (%q and %q differ)", ErrCrossSlot, ps[0].Key, p.Key)
			}
		}
	}
	st, err := s.run(ctx, op, at, ps)
	if err != nil {
		return drip.Multi{}, err
	}
	buckets := make([]drip.Bucket, len(ps))
	found := make([]bool, len(ps))
	for i := range ps {
		buckets[i], found[i] = st.bucket(i)
	}
	m, next, write := drip.EvalMulti(op, ps, buckets, found, st.now)
	for i := range ps {
		if err := st.check(i, m.Decisions[i].Allowed, next[i], write[i]); err != nil {
			return drip.Multi{}, err
		}
	}
	return m, nil
}

// Reset implements drip.Store.
func (s *Store) Reset(ctx context.Context, key string) error {
	if key == "" {
		return drip.ErrMissingKey
	}
	if err := s.c.Do(ctx, s.c.B().Del().Key(s.prefix+key).Build()).Error(); err != nil {
		return fmt.Errorf("redisstore: reset: %w", err)
	}
	return nil
}

// state is a script's reply: the time it decided at and, per request, the
// stored bucket before and what the script did.
type state struct {
	now     int64
	written bool
	reqs    []reqState
}

type reqState struct {
	found   bool
	before  drip.Bucket
	allowed bool
	next    drip.Bucket
}

const fieldsPerRequest = 8

func (s *Store) run(ctx context.Context, op drip.Op, at time.Time, ps []drip.Prepared) (state, error) {
	keys := make([]string, len(ps))
	args := make([]string, 2, 2+fieldsPerRequest*len(ps))
	args[0] = op.String()
	if !at.IsZero() {
		args[1] = strconv.FormatInt(at.UnixNano(), 10)
	}
	for i, p := range ps {
		keys[i] = s.prefix + p.Key
		reserve := "0"
		if p.Reserve {
			reserve = "1"
		}
		args = append(args,
			strconv.Itoa(int(p.Params.Kind)),
			strconv.FormatInt(p.Params.Rate, 10),
			strconv.FormatInt(p.Params.Period, 10),
			strconv.FormatInt(p.Params.Burst, 10),
			strconv.FormatInt(p.Params.MaxReserved, 10),
			strconv.FormatInt(p.Params.Start, 10),
			strconv.FormatInt(p.Cost, 10),
			reserve)
	}
	msgs, err := decideScript.Exec(ctx, s.c, keys, args).ToArray()
	if err != nil {
		return state{}, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	st, err := parseReply(msgs, len(ps))
	if err != nil {
		return state{}, fmt.Errorf("redisstore: %s: bad script reply: %w", op, err)
	}
	return st, nil
}

func parseReply(msgs []rueidis.RedisMessage, n int) (state, error) {
	if len(msgs) != 2+6*n {
		return state{}, fmt.Errorf("%d values, want %d", len(msgs), 2+6*n)
	}
	strs := make([]string, len(msgs))
	for i := range msgs {
		v, err := msgs[i].ToString()
		if err != nil {
			return state{}, err
		}
		strs[i] = v
	}
	num := func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
	var st state
	var err error
	if st.now, err = num(strs[0]); err != nil {
		return state{}, err
	}
	st.written = strs[1] == "1"
	st.reqs = make([]reqState, n)
	for i := range n {
		f := strs[2+6*i:]
		r := &st.reqs[i]
		r.found = f[0] == "1"
		if r.found {
			if r.before.Tokens, err = num(f[1]); err != nil {
				return state{}, err
			}
			if r.before.TS, err = num(f[2]); err != nil {
				return state{}, err
			}
		}
		r.allowed = f[3] == "1"
		if r.next.Tokens, err = num(f[4]); err != nil {
			return state{}, err
		}
		if r.next.TS, err = num(f[5]); err != nil {
			return state{}, err
		}
	}
	return st, nil
}

// bucket is request i's stored bucket, as drip.Eval takes it.
func (st *state) bucket(i int) (drip.Bucket, bool) {
	return st.reqs[i].before, st.reqs[i].found
}

// check holds the script to drip.Eval: the same verdict, the same next
// bucket, the same write. A mismatch is a bug in the script, reported
// rather than hidden.
func (st *state) check(i int, allowed bool, next drip.Bucket, write bool) error {
	r := st.reqs[i]
	if r.allowed != allowed || r.next != next || st.written != write {
		return fmt.Errorf("redisstore: script and drip.Eval disagree (a bug): script allowed=%v next=%+v written=%v, Eval allowed=%v next=%+v write=%v",
			r.allowed, r.next, st.written, allowed, next, write)
	}
	return nil
}
