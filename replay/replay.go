// Package replay runs drip's JSON-lines protocol (docs/api.md): one request per
// input line, one decision per output line, in order, on any drip.Store and
// in virtual time. drip replay and the decision API of drip serve share
// its request shape.
package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/driplimit/drip"
)

// MaxRequests is the most requests of one multi-take, here and in the
// decision API: a multi-take is one atomic step on the store, and a huge
// one would hold it (and every caller behind it) for long. A line with
// more is an error.
const MaxRequests = 100

// Line is one input line: a single request, or a multi-take when Requests
// is set.
type Line struct {
	// At is the virtual time in seconds since the start of the trace.
	At time.Duration
	// Op is the operation: "take" (default), "peek", "refund" or "reset".
	Op string
	// Request is the single request (unused for a multi-take).
	Request drip.Request
	// Requests is a multi-take's requests.
	Requests []drip.Request
}

// ReqJSON is a request as JSON. Cost is a pointer so that a missing cost
// defaults to 1 while an explicit 0 stays 0.
type ReqJSON struct {
	Key     string      `json:"key"`
	Cost    *float64    `json:"cost,omitempty"`
	Reserve bool        `json:"reserve,omitempty"`
	Limit   *drip.Limit `json:"limit,omitempty"`
}

type lineJSON struct {
	At json.RawMessage `json:"at"`
	Op string          `json:"op"`
	ReqJSON
	Requests []ReqJSON `json:"requests"`
}

// ToRequest checks a JSON request and applies the defaults (cost 1).
func (r ReqJSON) ToRequest() (drip.Request, error) {
	if r.Key == "" {
		return drip.Request{}, drip.ErrMissingKey
	}
	if r.Limit == nil {
		return drip.Request{}, fmt.Errorf("%w: missing limit", drip.ErrInvalidLimit)
	}
	cost := 1.0
	if r.Cost != nil {
		cost = *r.Cost
	}
	return drip.Request{Key: r.Key, Limit: *r.Limit, Cost: cost, Reserve: r.Reserve}, nil
}

// Parse decodes one input line strictly.
func Parse(b []byte) (Line, error) {
	var j lineJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return Line{}, fmt.Errorf("bad JSON: %w", err)
	}
	if dec.More() {
		return Line{}, errors.New("bad JSON: more than one value on the line")
	}
	var l Line
	if len(j.At) > 0 {
		var v any
		if err := json.Unmarshal(j.At, &v); err != nil {
			return Line{}, fmt.Errorf("at: %w", err)
		}
		at, err := drip.ParseSeconds(v)
		if err != nil {
			return Line{}, fmt.Errorf("at: %w", err)
		}
		l.At = at
	}
	l.Op = j.Op
	if l.Op == "" {
		l.Op = "take"
	}
	switch l.Op {
	case "take", "peek", "refund", "reset":
	default:
		return Line{}, fmt.Errorf("op %q is not take, peek, refund or reset", l.Op)
	}
	if j.Requests != nil {
		if j.Key != "" || j.Cost != nil || j.Limit != nil || j.Reserve {
			return Line{}, errors.New("a multi-take has requests instead of key, cost, limit and reserve")
		}
		if l.Op != "take" && l.Op != "peek" {
			return Line{}, fmt.Errorf("op %q does not take requests", l.Op)
		}
		if len(j.Requests) == 0 {
			return Line{}, drip.ErrNoRequests
		}
		if len(j.Requests) > MaxRequests {
			return Line{}, fmt.Errorf("%d requests: a multi-take has at most %d", len(j.Requests), MaxRequests)
		}
		for i, rj := range j.Requests {
			r, err := rj.ToRequest()
			if err != nil {
				return Line{}, fmt.Errorf("requests[%d]: %w", i, err)
			}
			l.Requests = append(l.Requests, r)
		}
		return l, nil
	}
	if l.Op == "reset" {
		if j.Key == "" {
			return Line{}, drip.ErrMissingKey
		}
		l.Request.Key = j.Key
		return l, nil
	}
	r, err := j.ReqJSON.ToRequest()
	if err != nil {
		return Line{}, err
	}
	l.Request = r
	return l, nil
}

// Op maps an op name to a drip.Op; ok is false for "reset".
func Op(name string) (drip.Op, bool) {
	switch name {
	case "peek":
		return drip.OpPeek, true
	case "refund":
		return drip.OpRefund, true
	case "reset":
		return 0, false
	}
	return drip.OpTake, true
}

// Epoch returns the instant virtual time 0 maps to for a run starting now:
// the current time, truncated to the second. Virtual times then lie near
// real time, so that a shared store's expiry (Redis TTLs, Postgres'
// expiry of idle rows) treats replayed buckets as it treats live ones.
func Epoch() time.Time { return time.Now().Truncate(time.Second) }

// Do performs one line on store at epoch + l.At, with keys prefixed by
// prefix, and returns the JSON output value. The output does not depend on
// the prefix or the epoch: a fixed window's grid is derived from the
// unprefixed key and counted from the epoch, as if the trace began at the
// Unix epoch.
func Do(ctx context.Context, store drip.Store, epoch time.Time, prefix string, l Line) (any, error) {
	at := epoch.Add(l.At)
	store = drip.Prefixed{Store: store, Prefix: prefix} // the grid comes from the unprefixed key
	// Count a fixed window's grid from the epoch, as if the trace began
	// at the Unix epoch.
	fix := func(r drip.Request) drip.Request {
		r.Limit = r.Limit.ForKey(r.Key)
		if r.Limit.Algorithm == drip.FixedWindow {
			p := r.Limit.Period
			if p == 0 {
				p = time.Second
			}
			shift := time.Duration(epoch.UnixNano() % int64(p))
			r.Limit.Start = (r.Limit.Start+shift)%p + p // never 0: 0 means "derive"
			if r.Limit.Start > p {
				r.Limit.Start -= p
			}
		}
		return r
	}
	if l.Op == "reset" {
		if err := store.Reset(ctx, l.Request.Key); err != nil {
			return nil, err
		}
		return map[string]bool{"reset": true}, nil
	}
	op, _ := Op(l.Op)
	if l.Requests != nil {
		rs := make([]drip.Request, len(l.Requests))
		for i, r := range l.Requests {
			rs[i] = fix(r)
		}
		return store.ApplyMulti(ctx, op, at, rs)
	}
	return store.Apply(ctx, op, at, fix(l.Request))
}

// Run reads lines from r and writes one output line per input line to w.
// Bad lines print {"error": "..."} and the run goes on; a failing store
// also prints an error line for that request. Run returns only I/O errors.
func Run(ctx context.Context, store drip.Store, prefix string, r io.Reader, w io.Writer) error {
	return RunAt(ctx, store, Epoch(), prefix, r, w)
}

// RunAt is Run with virtual time 0 at epoch.
func RunAt(ctx context.Context, store drip.Store, epoch time.Time, prefix string, r io.Reader, w io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var out any
		l, err := Parse(line)
		if err == nil {
			out, err = Do(ctx, store, epoch, prefix, l)
		}
		if err != nil {
			out = map[string]string{"error": err.Error()}
		}
		if err := enc.Encode(out); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return bw.Flush()
}
