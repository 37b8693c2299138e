package redisstore

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// reply is a script's reply: the server's time and, per
// request, the stored bucket before and what the script did.
type reply struct {
	now  int64 // the server's TIME in nanoseconds
	reqs []reqReply
}

type reqReply struct {
	found   bool
	before  bucket.State
	allowed bool
	written bool
	badType bool // the key holds a value of another type: no decision
	late    bool // run after its deadline: no decision, nothing written
	// leases is, for a request on a concurrency limit, the key's live
	// leases as the script read them (expiries in nanoseconds).
	leases bucket.LeaseSet
	// slide is, for a request on a sliding window, the key's state as the
	// script read it.
	slide bucket.SlidingState
	// hasBlocks reports a request decided under its key's blocks of
	// leased tokens (a block's request, or a key that held blocks), and
	// blocks are those the script read (expired ones included).
	hasBlocks bool
	blocks    []bucket.Block
}

func parseReply(msgs []rueidis.RedisMessage, n int) (reply, error) {
	if len(msgs) < 3 {
		return reply{}, fmt.Errorf("%d values, want at least 3", len(msgs))
	}
	sec, err1 := msgs[0].AsInt64()
	nsec, err2 := msgs[1].AsInt64()
	recs, err3 := msgs[2].ToString()
	if err := errors.Join(err1, err2, err3); err != nil {
		return reply{}, err
	}
	if len(recs) != replyRecord*n {
		return reply{}, fmt.Errorf("%d bytes of records, want %d", len(recs), replyRecord*n)
	}
	rep := reply{now: join(sec, nsec), reqs: make([]reqReply, n)}
	big := msgs[3:]
	for i := range n {
		r := recs[replyRecord*i:]
		f := r[0]
		tokens := float64at(r[1:])
		if f&128 != 0 {
			// A sliding window's state before, or with 64 too a bucket's
			// blocks before, stored as decimals.
			if len(big) == 0 {
				return reply{}, errors.New("missing sliding window or blocks state")
			}
			st, err := big[0].ToString()
			if err != nil {
				return reply{}, err
			}
			big = big[1:]
			if f&64 != 0 {
				rep.reqs[i].hasBlocks = true
				if rep.reqs[i].blocks, err = parseBlocks(st); err != nil {
					return reply{}, err
				}
			} else if rep.reqs[i].slide, err = parseSliding(st); err != nil {
				return reply{}, err
			}
		}
		if f&16 != 0 {
			if len(big) == 0 {
				return reply{}, errors.New("missing big tokens")
			}
			t, err := big[0].AsInt64()
			if err != nil {
				return reply{}, err
			}
			big = big[1:]
			rep.reqs[i].before.Tokens = t
		} else {
			rep.reqs[i].before.Tokens = int64(tokens)
		}
		rep.reqs[i].before.TS = join(int64(float64at(r[9:])), int64(float64at(r[17:])))
		rep.reqs[i].found = f&4 != 0
		rep.reqs[i].allowed = f&1 != 0
		rep.reqs[i].written = f&2 != 0
		rep.reqs[i].badType = f&8 != 0
		rep.reqs[i].late = f&32 != 0
		// A lease request's record: live leases, earliest and latest
		// expiry in microseconds (exact doubles).
		rep.reqs[i].leases = bucket.LeaseSet{Live: int64(tokens), Held: f&64 != 0,
			Earliest: int64(float64at(r[9:])) * 1e3, Latest: int64(float64at(r[17:])) * 1e3}
	}
	if len(big) != 0 {
		return reply{}, fmt.Errorf("%d big tokens left over", len(big))
	}
	return rep, nil
}

// parseSliding reads a sliding window's stored state, "last c1 ... cn"
// ("" when the key had none).
func parseSliding(s string) (bucket.SlidingState, error) {
	var st bucket.SlidingState
	if s == "" {
		return st, nil
	}
	f := strings.Fields(s)
	if len(f) > bucket.MaxSlots+2 {
		return st, fmt.Errorf("sliding window state of %d fields", len(f))
	}
	for i, x := range f {
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			// Not the value: it is the key's state, not the server's word.
			return st, fmt.Errorf("sliding window state: field %d of %d is not an integer", i+1, len(f))
		}
		if i == 0 {
			st.Last = n
		} else {
			st.Counts = append(st.Counts, n)
		}
	}
	if st.Counts == nil {
		st.Counts = []int64{}
	}
	return st, nil
}

// parseBlocks reads a key's blocks as stored after its bucket (see
// decide.lua): "id size s n ..." ("" when none).
func parseBlocks(s string) ([]bucket.Block, error) {
	f := strings.Fields(s)
	if len(f)%4 != 0 || len(f) > 4*bucket.MaxBlocks {
		return nil, fmt.Errorf("blocks state of %d fields", len(f))
	}
	bs := make([]bucket.Block, 0, len(f)/4)
	for i := 0; i < len(f); i += 4 {
		size, err1 := strconv.ParseInt(f[i+1], 10, 64)
		sec, err2 := strconv.ParseInt(f[i+2], 10, 64)
		nsec, err3 := strconv.ParseInt(f[i+3], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("blocks state: %w", err)
		}
		bs = append(bs, bucket.Block{ID: f[i], Size: size, Exp: join(sec, nsec)})
	}
	return bs, nil
}

// float64at is the little-endian double at the start of b.
func float64at(b string) float64 {
	return math.Float64frombits(uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56)
}

// nowFor is the time of a decision asked at at.
func (rep *reply) nowFor(at time.Time) int64 {
	if at.IsZero() {
		return rep.now
	}
	return at.UnixNano()
}

// decide is request i's decision, recomputed with bucket.Eval from the
// state the script saw, and checked against what the script did.
func (rep *reply) decide(i int, op bucket.Op, at time.Time, p bucket.Prepared) (bucket.Result, error) {
	r := rep.reqs[i]
	var res bucket.Result
	var write bool
	switch {
	case p.Params.Kind == bucket.Concurrency:
		res, write = p.Params.EvalLeases(op, r.leases, p.Lease, rep.nowFor(at))
	case p.Params.Kind == bucket.Sliding:
		res, _, write = bucket.EvalSliding(op, r.slide, r.found, p.Params.Sliding(), p.Cost, rep.nowFor(at))
	case r.hasBlocks:
		res, _, _, write = bucket.EvalBlocks(op, r.before, r.found, r.blocks, &p, rep.nowFor(at))
	default:
		res, _, write = bucket.Eval(op, r.before, r.found, p.Params, p.Cost, p.Reserve, rep.nowFor(at))
	}
	if err := rep.check(i, res.Allowed, write); err != nil {
		return bucket.Result{}, err
	}
	return res, nil
}

// check holds the script to bucket.Eval: the same verdict and the same
// write. (What it wrote is held to Eval by the next decision on the key,
// which storetest compares.) A mismatch is a bug in the script, reported
// rather than hidden.
func (rep *reply) check(i int, allowed, write bool) error {
	r := rep.reqs[i]
	if r.late {
		return errLate
	}
	if r.badType {
		return wrongType
	}
	if r.allowed != allowed || r.written != write {
		return &store.AnsweredError{Err: fmt.Errorf("redisstore: script and bucket.Eval disagree (a bug): script allowed=%v written=%v, Eval allowed=%v write=%v",
			r.allowed, r.written, allowed, write)}
	}
	return nil
}

// split is t nanoseconds as whole seconds (rounded down) and nanoseconds.
func split(t int64) (sec, nsec int64) {
	sec, nsec = t/1e9, t%1e9
	if nsec < 0 {
		sec, nsec = sec-1, nsec+1e9
	}
	return sec, nsec
}

func join(sec, nsec int64) int64 { return sec*1e9 + nsec }

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
