// Package redisstore keeps drip's buckets in Redis or Redis Cluster (and
// Valkey), through github.com/redis/rueidis.
//
// Every decision is one call of Lua code (the script): a Redis Function
// (FCALL; loaded on first use and again when a server lost it), or on
// servers without functions a script (EVALSHA, falling back to EVAL when
// the script cache is empty); see call.go. It reads the bucket, decides
// and writes in one atomic step, with the server's clock (TIME) unless the
// caller supplies a time. A multi-take is one call over all its keys,
// all-or-nothing. Concurrent calls share connections through rueidis's
// auto-pipelining, and on a standalone server concurrent decisions,
// multi-takes of up to 16 keys included, are coalesced into one call
// (WithBatching).
//
// State is exact: one string key per bucket holding tokens
// (micro-tokens), the bucket's time in seconds and nanoseconds, and (in
// the wider forms) when the key's TTL ends: nearly always in a short form
// of 12 bytes (the nanoseconds plus 2^31, the seconds and the tokens as
// big-endian 32-bit integers; the key's own TTL holds its end); for
// tokens beyond 32 bits in a compact form of 20 bytes (the byte 1, the
// tokens as a 7-byte integer, then the seconds, nanoseconds and the TTL's
// end in whole seconds as little-endian 32-bit integers); for times
// before 1970 or after 2106 as four little-endian doubles after a zero
// byte, and for tokens beyond 2^52 in magnitude as decimals, "tokens s n
// deadline" (the forms of earlier versions, all still read). The script does its
// arithmetic in exact integers (bigint.lua), so decisions are the ones
// bucket.Eval makes, bit for bit; the Go side recomputes each with
// bucket.Eval from the state the script read and reports any disagreement
// as an error. Every write leaves the key a TTL of at least a minute past
// the bucket's expiry (bucket.Params.ExpiresAt), so idle buckets vanish.
//
// Leased tokens (bucket.EvalBlocks, package leased): a key's live blocks
// follow its bucket in the same value, and the same script takes and
// returns them and decides every request on the key under their cap, in
// one call, so instances that lease a limit and instances that do not
// can share its keys. A key without live blocks is stored as above. (The
// values under key#leased of earlier versions are not read; see
// docs/semantics.md.)
//
// Concurrency limits: a key is a sorted set of lease IDs scored by their
// expiries in microseconds, read and written by the same script in the
// same call (so a multi-take mixing leases and buckets stays one atomic
// step). The script counts what bucket.Leases summarizes and the Go side
// checks its verdict against bucket.Params.EvalLeases. The key lives a
// minute past its latest lease, and is gone with its last one.
//
// Sentinel: Open with a redis+sentinel:// URL (see ParseURL) finds the
// master through the Sentinels and follows its failovers.
//
// Redis Cluster: all keys of a multi-take must hash to one slot. Put the
// part they share in braces, a hash tag: "{tenant-7}:user:42" and
// "{tenant-7}" hash alike (see Tag). A multi-take whose keys do not share
// a slot fails with ErrCrossSlot before anything is sent. MOVED, ASK and
// failovers are followed by the client.
//
// Deadlines: a request answered with an error took nothing. Each request
// carries its caller's deadline in the server's clock (learned from the
// TIME in earlier replies), and the script refuses one whose deadline is
// past when it runs, writing nothing (a request that waited in a socket
// buffer while the server was paused); its caller gets an error that
// wraps context.DeadlineExceeded. On Redis Cluster the store learns one
// offset for all nodes: a node whose clock lags the others' by some
// milliseconds may apply a request that much after its caller's deadline.
package redisstore

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/batch"
	"github.com/driplimit/drip/internal/redact"
	"github.com/driplimit/drip/store"
)

//go:embed bigint.lua
var bigintLua string

//go:embed decide.lua
var decideLua string

// ErrCrossSlot is returned for a multi-take on Redis Cluster whose keys do
// not all hash to one slot.
var ErrCrossSlot = fmt.Errorf("redisstore: keys of a multi-take must share a hash slot on Redis Cluster; give them a common hash tag, e.g. {tenant}:user:1 and {tenant} (%w)", store.ErrNotColocated)

// ErrWrongType is returned for a request whose key holds a Redis value of
// another type (something else wrote into drip's key space): that request
// gets no decision and writes nothing; the other requests of a batch are
// decided as usual, and a multi-take writes nothing.
var ErrWrongType = errors.New("redisstore: the key holds a value of another type (WRONGTYPE); is another program writing under drip's prefix?")

// wrongType is ErrWrongType as the store returns it: an error the server
// answered about one request, which says nothing about its health.
var wrongType error = &store.AnsweredError{Err: ErrWrongType}

// DefaultPrefix is put before every key unless WithPrefix says otherwise.
const DefaultPrefix = "drip:"

// Store is a store.Store on Redis. It is safe for concurrent use.
type Store struct {
	c       rueidis.Client
	prefix  string
	cluster bool
	owned   bool
	batch   *batch.Batcher[request, answer]

	batching    Batching
	clock       batch.Clock // the server's clock, for deadlines
	lastShape   atomic.Pointer[shapeText]
	scriptsOnly atomic.Bool // the server has no functions: use scripts
	loadMu      sync.Mutex  // one FUNCTION LOAD at a time
	loads       atomic.Uint64
	stopOnce    sync.Once
	life        context.Context // ends at Close
	end         context.CancelFunc
}

var _ store.Store = (*Store)(nil)

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the string put before every key (default "drip:"). It
// must not contain '{': a hash tag belongs in the keys.
func WithPrefix(p string) Option { return func(s *Store) { s.prefix = p } }

// New returns a store on a client the caller already has (standalone,
// cluster or sentinel). Close does not close c.
func New(c rueidis.Client, opts ...Option) *Store {
	s := &Store{c: c, prefix: DefaultPrefix, cluster: c.Mode() == rueidis.ClientModeCluster, batching: DefaultBatching}
	s.life, s.end = context.WithCancel(context.Background())
	for _, o := range opts {
		o(s)
	}
	if s.batching.On() && !s.cluster {
		s.batch = newBatcher(s)
	}
	return s
}

// Open connects to the server a URL names: redis://[user:pass@]host:port[/db]
// or rediss:// for TLS. The same URL pointed at one node of a cluster
// reaches the whole cluster; more nodes to start from go in ?addr=host:port
// (repeatable). redis+sentinel://host:port[,host:port...]/master_name[/db]
// (rediss+sentinel:// for TLS) finds the master through Sentinel and
// follows its failovers; so does rueidis's redis://host:port?master_set=name.
// ParseURL has every form and parameter. Close closes the connection.
func Open(url string, opts ...Option) (*Store, error) {
	o, err := ParseURL(url)
	if err != nil {
		return nil, redact.Error(err)
	}
	c, err := rueidis.NewClient(o)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	s := New(c, opts...)
	s.owned = true
	return s, nil
}

// Prefix is the prefix put before every key.
func (s *Store) Prefix() string { return s.prefix }

// Client is the store's client.
func (s *Store) Client() rueidis.Client { return s.c }

// Close stops the batching workers, if any, and closes the client if Open
// made it.
func (s *Store) Close() error {
	s.stopOnce.Do(func() {
		s.end()
		if s.batch != nil {
			s.batch.Close()
		}
		if s.owned {
			s.c.Close()
		}
	})
	return nil
}

// Tag returns key under the hash tag tag, "{tag}:key": keys with the same
// tag land in the same Redis Cluster slot, so a multi-take can span them.
func Tag(tag, key string) string { return "{" + tag + "}:" + key }

// Apply implements store.Store: one item through the batcher (or a batch
// of one), several in one call of the script, all or nothing.
//
// With batching, a multi-take of up to 16 items goes in a batch too, its
// items decided together in their place (all or nothing, as in a call
// of its own): a call of the script costs the server far more than one
// more take in it.
func (s *Store) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if len(items) > 1 && (s.batch == nil || len(items) > maxJoined) {
		return s.applyMulti(ctx, op, at, items, results)
	}
	if len(items) == 0 {
		return nil
	}
	if s.batch != nil {
		q := request{op: op, at: at}
		if len(items) == 1 {
			q.p = items[0]
		} else {
			// A copy: the batch may read the items after its caller
			// left (to take back what they took).
			q.ps = slices.Clone(items)
		}
		a, err := s.batch.Do(ctx, q)
		if errors.Is(err, batch.ErrClosed) {
			err = errClosed
		}
		if q.ps == nil {
			results[0] = a.one
		} else if err == nil {
			copy(results, a.many)
		}
		return err
	}
	p := items[0]
	// A batch of one: the same decision as a take of one key, and the
	// batch loop has the script's straight path for common takes.
	dl := batch.SendBy(ctx) // the caller's deadline, less the reply's margin
	rep, err := s.run(ctx, "batch", []bucket.Op{op}, []time.Time{at}, []time.Time{dl}, items, nil)
	if err != nil {
		return err
	}
	results[0], err = rep.decide(0, op, at, p)
	return err
}

// Caps implements store.Store: the store holds leases, sliding and
// calendar windows, and keeps overrides (override.go); on Redis Cluster, keys of one call must share a hash slot
// (ErrCrossSlot).
func (s *Store) Caps() store.Caps {
	return store.Caps{Name: "redisstore", SplitsKeys: s.cluster, Leases: true, Sliding: true, Calendar: true, Blocks: true, Overrides: s, Board: s}
}

// applyMulti applies several items in one call of the script.
func (s *Store) applyMulti(ctx context.Context, op bucket.Op, at time.Time, ps []bucket.Prepared, results []bucket.Result) error {
	if s.cluster {
		slot := Slot(s.prefix + ps[0].Key)
		for _, p := range ps[1:] {
			if Slot(s.prefix+p.Key) != slot {
				return fmt.Errorf("%w (%q and %q differ)", ErrCrossSlot, ps[0].Key, p.Key)
			}
		}
	}
	dl := batch.SendBy(ctx) // the caller's deadline, less the reply's margin
	// One op, time and deadline for every item (see run).
	rep, err := s.run(ctx, op.String(), []bucket.Op{op}, []time.Time{at}, []time.Time{dl}, ps, nil)
	if err != nil {
		return err
	}
	return rep.decideAll(0, op, at, ps, results)
}

// decideAll is the decisions of a multi-take whose items ps are requests
// from, from+1, ... of the reply, recomputed with bucket.EvalMultiAll
// from the states the script read and checked against what it did; it
// sets results.
func (rep *reply) decideAll(from int, op bucket.Op, at time.Time, ps []bucket.Prepared, results []bucket.Result) error {
	if rep.reqs[from].late {
		return errLate // and the script wrote nothing
	}
	now := rep.nowFor(at)
	// The states the script read, on the stack for the usual few items.
	var (
		bucketsA [4]bucket.State
		foundA   [4]bool
		leasesA  [4]bucket.LeaseSet
		slidesA  [4]bucket.SlidingState
	)
	buckets, found, leases, slides := bucketsA[:0], foundA[:0], leasesA[:0], slidesA[:0]
	var blocks [][]bucket.Block
	for i := range ps {
		r := &rep.reqs[from+i]
		if r.badType {
			return wrongType // and the script wrote nothing
		}
		buckets, found = append(buckets, r.before), append(found, r.found)
		leases, slides = append(leases, r.leases), append(slides, r.slide)
		if r.hasBlocks && blocks == nil {
			blocks = make([][]bucket.Block, len(ps))
		}
		if blocks != nil {
			blocks[i] = r.blocks
		}
	}
	res, _, _, _, write := bucket.EvalMultiAll(op, ps, buckets, found, leases, slides, blocks, now)
	for i := range ps {
		if err := rep.check(from+i, res[i].Allowed, write[i]); err != nil {
			return err
		}
	}
	copy(results, res)
	return nil
}

// Reset implements store.Store.
func (s *Store) Reset(ctx context.Context, key string) error {
	if err := store.CheckKey(key); err != nil {
		return err
	}
	if err := s.c.Do(ctx, s.c.B().Del().Key(s.prefix+key).Build()).Error(); err != nil {
		return fmt.Errorf("redisstore: reset: %w", err)
	}
	return nil
}

const (
	requestRecord = 29 // struct '<IBddd'
	replyRecord   = 25 // struct '<Bddd'

)

// shape is what requests under the same limit and cost share in a call.
type shape struct {
	p       bucket.Params
	cost    int64
	reserve bool
}

// shapeText is sh.text(), kept for the shape of the last call: most
// calls of a store carry the same one or few limits (a rule's, a
// descriptor's), and the text is nine integers formatted afresh otherwise.
func (s *Store) shapeText(sh shape) string {
	if c := s.lastShape.Load(); c != nil && c.sh == sh {
		return c.text
	}
	t := sh.text()
	s.lastShape.Store(&shapeText{sh, t})
	return t
}

type shapeText struct {
	sh   shape
	text string
}

// keys are the server's keys of ps (the prefix and each key), cut from one
// string: one allocation for all of them.
func (s *Store) keys(ps []bucket.Prepared) []string {
	n := 0
	for i := range ps {
		n += len(s.prefix) + len(ps[i].Key)
	}
	var all strings.Builder
	all.Grow(n)
	for i := range ps {
		all.WriteString(s.prefix)
		all.WriteString(ps[i].Key)
	}
	str, keys := all.String(), make([]string, len(ps))
	at := 0
	for i := range ps {
		end := at + len(s.prefix) + len(ps[i].Key)
		keys[i], at = str[at:end], end
	}
	return keys
}

// text is the shape as the script reads it (see decide.lua), which also
// keys the script's cache of parsed shapes.
func (sh shape) text() string {
	l := sh.p
	g := gcd(l.Rate, l.Period)
	b := make([]byte, 0, 96)
	for _, v := range []int64{int64(l.Kind), l.Rate, l.Period, l.Rate / g, l.Period / g, l.Burst, l.MaxReserved, l.Start, sh.cost} {
		b = strconv.AppendInt(b, v, 10)
		b = append(b, ' ')
	}
	if sh.reserve {
		return string(append(b, '1'))
	}
	return string(append(b, '0'))
}

// run calls the script in mode ("take", "peek", "refund" or "batch") for
// requests ps, each with its op, time and deadline (ops, ats and dls of
// one element: the same for every request; a zero deadline: none; the
// script refuses a request whose deadline passed on the server's clock,
// see batch.Clock); joined (nil: none) marks, in batch mode, the requests
// joined to the next, all or nothing. Requests of the same shape (a
// limit and a cost, as a rule's requests) share its arguments, sent as
// decimals once per call; each request is a small fixed record of one
// packed argument (see decide.lua), which costs the server much less to
// read than arguments of its own.
func (s *Store) run(ctx context.Context, mode string, ops []bucket.Op, ats, dls []time.Time, ps []bucket.Prepared, joined []bool) (reply, error) {
	if !s.clock.Known() && slices.ContainsFunc(dls, func(d time.Time) bool { return !d.IsZero() }) {
		if err := s.syncClock(ctx); err != nil {
			return reply{}, err
		}
	}
	keys := s.keys(ps)
	var shapesA [4]shape // the usual few, on the stack
	shapes := shapesA[:0]
	// The records, written into the argument's string itself (no copy).
	var recs strings.Builder
	recs.Grow(requestRecord * len(ps))
	var rec [requestRecord]byte
	last := -1
	one := len(ops) == 1
	for i, p := range ps {
		j := i
		if one {
			j = 0
		}
		sh := shape{p.Params, p.Cost, p.Reserve}
		if p.Params.Kind == bucket.Sliding {
			// The script reads a sliding window's slot as its rate, its
			// slots as its start and its grid's offset as its
			// max_reserved (see decide.lua).
			sp := p.Params.Sliding()
			sh.p.Rate, sh.p.Start, sh.p.MaxReserved = sp.Slot(), p.Params.Parts, sp.Start
		}
		if last < 0 || shapes[last] != sh {
			last = slices.Index(shapes, sh)
			if last < 0 {
				last = len(shapes)
				shapes = append(shapes, sh)
			}
		}
		op := byte(ops[j])
		if p.Block != "" {
			op += 8 // its block's ID and life follow the records
		}
		if joined != nil && joined[i] {
			op += 16 // decided with the next, all or nothing
		}
		var sec, nsec int64
		if !ats[j].IsZero() {
			op += 4
			sec, nsec = split(ats[j].UnixNano())
		}
		// Seconds (below 2^34 for any time.Time in int64 nanoseconds) and
		// nanoseconds are exact as doubles.
		binary.LittleEndian.PutUint32(rec[0:], uint32(last+1))
		rec[4] = op
		binary.LittleEndian.PutUint64(rec[5:], math.Float64bits(float64(sec)))
		binary.LittleEndian.PutUint64(rec[13:], math.Float64bits(float64(nsec)))
		// The deadline in whole microseconds of the server's clock,
		// rounded down (exact as a double).
		binary.LittleEndian.PutUint64(rec[21:], math.Float64bits(float64(max(0, s.clock.Deadline(dls[j])/1e3))))
		recs.Write(rec[:])
	}
	args := make([]string, 0, 3+len(shapes))
	args = append(args, mode, strconv.Itoa(len(shapes)))
	for _, sh := range shapes {
		args = append(args, s.shapeText(sh))
	}
	args = append(args, recs.String())
	for _, p := range ps {
		switch {
		case p.Params.Kind == bucket.Concurrency:
			args = append(args, p.Lease) // after the records, in order
		case p.Block != "":
			args = append(args, p.Block+" "+strconv.FormatInt(p.BlockTTL, 10))
		}
	}
	msgs, err := s.exec(ctx, keys, args)
	if err != nil {
		if scriptFailed(err) {
			// The server ran the call and answered its error: it is up,
			// and the error is about this call's items.
			return reply{}, &store.AnsweredError{Err: fmt.Errorf("redisstore: %s: %w", mode, err)}
		}
		// A failed connection or server: the next answer may come from
		// another server (a failover), whose clock is learned afresh.
		s.clock.ForgetOn(err)
		return reply{}, fmt.Errorf("redisstore: %s: %w", mode, err)
	}
	recv := time.Now()
	rep, err := parseReply(msgs, len(ps))
	if err != nil {
		return reply{}, fmt.Errorf("redisstore: %s: bad script reply: %w", mode, err)
	}
	s.clock.Observe(recv, rep.now)
	return rep, nil
}
