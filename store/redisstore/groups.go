package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/batch"
)

// Concurrent multi-takes (several keys all or nothing, such as an Envoy
// call of two descriptors) are batched too: one call of the library's
// groups function runs each as the call it would have been on its own
// (its keys all or nothing, its own deadline), in order. On its own, a
// multi-take cost the server a whole call (about three times a batched
// decision, in the Envoy benchmark on Redis).

// group is one multi-take waiting in a batch.
type group struct {
	op bucket.Op
	at time.Time
	ps []bucket.Prepared
}

// errNoGroups is the server without functions: there is no groups
// function, and each multi-take of the batch goes as its own call.
var errNoGroups = errors.New("redisstore: no groups function on a server without functions")

func newGroupBatcher(s *Store) *batch.Batcher[group, []bucket.Result] {
	return batch.New(s.batching, nil, s.runGroups, undoGroup)
}

// undoGroup is the refund of a multi-take the server applied whose
// caller had left (see undo): every key gives back what it took.
func undoGroup(g group, rs []bucket.Result) (group, bool) {
	if g.op != bucket.Take || len(rs) == 0 {
		return group{}, false
	}
	for _, r := range rs {
		if !r.Allowed {
			return group{}, false
		}
	}
	g.op = bucket.Refund
	return g, true
}

// runGroups decides calls in one call of the groups function (see
// runBatch for why it waits for the answer past ctx's deadline).
func (s *Store) runGroups(ctx context.Context, calls []*batch.Call[group, []bucket.Result]) {
	for _, c := range calls {
		if c.Deadline.IsZero() || s.clock.Known() {
			continue
		}
		if err := s.syncClock(ctx); err != nil {
			for _, c := range calls {
				c.Err = err
			}
			return
		}
	}
	var keys []string
	args := []string{strconv.Itoa(len(calls))}
	for _, c := range calls {
		g := c.Req
		k, a := s.build(g.op.String(), []bucket.Op{g.op}, []time.Time{g.at}, []time.Time{c.SendBy}, g.ps)
		keys = append(keys, k...)
		args = append(append(args, strconv.Itoa(len(k)), strconv.Itoa(len(a))), a...)
	}
	msgs, err := s.exec(s.life, groupsFn, keys, args)
	if errors.Is(err, errNoGroups) {
		for _, c := range calls { // each on its own, as the script can
			g := c.Req
			rep, err := s.run(s.life, g.op.String(), []bucket.Op{g.op}, []time.Time{g.at}, []time.Time{c.SendBy}, g.ps)
			c.Res, c.Err = s.groupResult(rep, err, g)
		}
		return
	}
	if err == nil && len(msgs) != len(calls) {
		err = fmt.Errorf("%d answers for %d calls", len(msgs), len(calls))
	}
	if err != nil {
		s.clock.ForgetOn(err)
		for _, c := range calls {
			c.Err = fmt.Errorf("redisstore: groups: %w", err)
		}
		return
	}
	for i, c := range calls {
		g := c.Req
		sub, err := msgs[i].ToArray()
		var rep reply
		if err == nil {
			rep, err = s.parse(g.op.String(), sub, len(g.ps))
		}
		c.Res, c.Err = s.groupResult(rep, err, g)
	}
}

// groupResult is a multi-take's results from its reply (or its error).
func (s *Store) groupResult(rep reply, err error, g group) ([]bucket.Result, error) {
	if err != nil {
		return nil, err
	}
	res := make([]bucket.Result, len(g.ps))
	if err := rep.multi(g.op, g.at, g.ps, res); err != nil {
		return nil, err
	}
	return res, nil
}
