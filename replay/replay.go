// Package replay runs drip's JSON-lines protocol (docs/api.md): one request per
// input line, one decision per output line, in order, on any store.Store and
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
	"reflect"
	"strings"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/seconds"
	"github.com/driplimit/drip/internal/strictjson"
	"github.com/driplimit/drip/store"
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
// defaults to 1 while an explicit 0 stays 0. Rule and Values name a rule's
// bucket instead of Key and Limit, in the decision API only (BodyFormat).
type ReqJSON struct {
	Key     string          `json:"key"`
	Cost    *float64        `json:"cost,omitempty"`
	Reserve bool            `json:"reserve,omitempty"`
	Limit   *drip.Limit     `json:"limit,omitempty"`
	Rule    *string         `json:"rule,omitempty"`
	Values  json.RawMessage `json:"values,omitempty"`
	// Lease is the lease ID of a request on a concurrency limit.
	Lease string `json:"lease,omitempty"`
}

// Raw is one request of the protocol as read: a line of drip replay, a
// trace line of drip simulate, or a decision API body.
type Raw struct {
	// At is the virtual time in seconds since the start of the trace.
	At time.Duration
	// Op is "take" (default), "peek", "refund" or "reset".
	Op string
	ReqJSON
	// Requests is a multi-take's requests (nil for a single request).
	Requests []ReqJSON
	// Wait is how long a take may wait for its turn instead of being
	// denied (the decision API's "wait"); 0: it answers at once.
	Wait time.Duration
	// Priority is the class of priority the body names (the decision
	// API's "priority": a class name, or a whole number given as a
	// number or a string), as text for rules.ParsePriority; "": none.
	Priority string
}

type lineJSON struct {
	At   json.RawMessage `json:"at"`
	Op   *string         `json:"op"`
	Wait json.RawMessage `json:"wait"`
	// Priority is a string or a number: json.Number keeps a number's text.
	Priority *json.RawMessage `json:"priority"`
	ReqJSON
	Requests []ReqJSON `json:"requests"`
}

// Format is where requests are read: what one may hold, and what one is
// called in messages.
type Format struct {
	// Unit is "line" or "body"; Where says where a second value would
	// be ("on the line", "in the body").
	Unit, Where string
	// Timed allows "at" and "op" (drip replay, drip simulate).
	Timed bool
	// Rules allows "rule" and "values" (the decision API).
	Rules bool
}

// The formats of drip replay and drip simulate (a line), and of the
// decision API (a body; its op is the path, its time the store's).
var (
	LineFormat = Format{Unit: "line", Where: "on the line", Timed: true}
	BodyFormat = Format{Unit: "body", Where: "in the body", Rules: true}
)

// Decode reads one request in format f strictly: unknown fields (and the
// fields f does not allow), trailing data, a bad "at" or "op" are errors,
// and so is what encoding/json alone would let pass (see strict): invalid
// UTF-8, a lone surrogate escape, a field given twice, a field name in
// another case (strictjson). Every error it returns is a *store.InputError.
// What it returns holds no part of b.
func Decode(b []byte, f Format) (Raw, error) {
	if err := strictjson.Check(b, "values"); err != nil {
		return Raw{}, inputf("bad JSON: %w", err)
	}
	if r, ok := decodeFast(b); ok {
		return r, nil
	}
	return decodeJSON(b, f)
}

// decodeJSON is Decode after the strict check, with encoding/json: any
// request, and every error.
func decodeJSON(b []byte, f Format) (Raw, error) {
	var j lineJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		if err == io.EOF {
			return Raw{}, inputf("bad JSON: empty %s", f.Unit)
		}
		return Raw{}, decodeProblem(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Raw{}, inputf("bad JSON: more than one value %s", f.Where)
	}
	if err := f.allowed(&j); err != nil {
		return Raw{}, err
	}
	r := Raw{Op: "take", ReqJSON: j.ReqJSON, Requests: j.Requests}
	if len(j.Wait) > 0 {
		var v any
		if err := json.Unmarshal(j.Wait, &v); err != nil {
			return Raw{}, inputf("wait: %w", err)
		}
		w, err := seconds.Parse(v)
		if err != nil || w < 0 {
			return Raw{}, inputf("wait: must be a duration (\"200ms\") or a number of seconds, at least 0")
		}
		r.Wait = w
	}
	if j.Priority != nil {
		p, err := priorityText(*j.Priority)
		if err != nil {
			return Raw{}, err
		}
		r.Priority = p
	}
	if len(j.At) > 0 {
		var v any
		if err := json.Unmarshal(j.At, &v); err != nil {
			return Raw{}, inputf("at: %w", err)
		}
		at, err := seconds.Parse(v)
		if err != nil {
			return Raw{}, inputf("at: %w", err)
		}
		r.At = at
	}
	if j.Op != nil && *j.Op != "" {
		r.Op = *j.Op
	}
	switch r.Op {
	case "take", "peek", "refund", "reset":
	default:
		return Raw{}, inputf("op %q is not take, peek, refund or reset", r.Op)
	}
	return r, nil
}

// priorityText is the text of a "priority" value: a string as it is,
// a number as written (rules.ParsePriority reads either); anything else,
// or an empty string, is bad input. The decision API bounds the text
// (rules.MaxPriorityValue) as it parses it.
func priorityText(v json.RawMessage) (string, error) {
	bad := inputf("priority: must be critical, default, sheddable, batch or a whole number from 0 to 100")
	var s string
	if err := json.Unmarshal(v, &s); err == nil {
		if s == "" {
			return "", bad
		}
		return s, nil
	}
	var n json.Number
	if err := json.Unmarshal(v, &n); err != nil {
		return "", bad
	}
	return n.String(), nil
}

// allowed refuses the fields f does not allow, as unknown fields.
func (f Format) allowed(j *lineJSON) error {
	unknown := func(name string) error { return inputf("bad JSON: json: unknown field %q", name) }
	if !f.Rules {
		for _, it := range append([]ReqJSON{j.ReqJSON}, j.Requests...) {
			switch {
			case it.Rule != nil:
				return unknown("rule")
			case it.Values != nil:
				return unknown("values")
			}
		}
	}
	switch {
	case !f.Timed && j.At != nil:
		return unknown("at")
	case !f.Timed && j.Op != nil:
		return unknown("op")
	case !f.Rules && j.Wait != nil:
		return unknown("wait") // only the decision API waits
	case !f.Rules && j.Priority != nil:
		return unknown("priority")
	}
	return nil
}

// CheckMulti checks a multi-take: requests instead of the single
// request's fields, then an op that takes requests (opErr, nil when it
// does), then at least one request and at most MaxRequests.
func (r *Raw) CheckMulti(f Format, opErr error) error {
	single := r.Key != "" || r.Cost != nil || r.Limit != nil || r.Reserve || r.Lease != ""
	if f.Rules {
		if single || r.Rule != nil || r.Values != nil {
			return inputf("a multi-take has requests instead of key, limit, rule, values, cost, reserve and lease")
		}
	} else if single {
		return inputf("a multi-take has requests instead of key, cost, limit, reserve and lease")
	}
	if opErr != nil {
		return opErr
	}
	if len(r.Requests) == 0 {
		return &store.InputError{Err: store.ErrNoRequests}
	}
	if len(r.Requests) > MaxRequests {
		return inputf("%d requests: a multi-take has at most %d", len(r.Requests), MaxRequests)
	}
	return nil
}

// decodeProblem says what decoding a request found wrong in the words of
// the JSON the client sent: a limit that is not valid is not bad JSON,
// and a value of the wrong type is named by its field, not by drip's Go
// types (encoding/json's "cannot unmarshal number 1e9 into Go struct
// field limitJSON.max_in_flight of type int").
func decodeProblem(err error) error {
	if errors.Is(err, drip.ErrInvalidLimit) {
		return inputf("%w", err)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if i := strings.LastIndexByte(field, '.'); i >= 0 {
			field = field[i+1:]
		}
		want := ""
		switch te.Type.Kind() {
		case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint, reflect.Uint64, reflect.Uint32:
			want = "a whole number in digits (1000, not 1e3 or 1.5)"
		case reflect.Float64, reflect.Float32:
			want = "a number"
		case reflect.String:
			want = "a string"
		case reflect.Bool:
			want = "true or false"
		}
		if field != "" && want != "" {
			return inputf("bad JSON: %q must be %s, not %s", field, want, te.Value)
		}
	}
	return inputf("bad JSON: %w", err)
}

func inputf(format string, args ...any) error {
	return &store.InputError{Err: fmt.Errorf(format, args...)}
}

// ToRequest checks a JSON request and applies the defaults (cost 1).
func (r ReqJSON) ToRequest() (drip.Request, error) {
	if r.Key == "" {
		return drip.Request{}, &store.InputError{Err: store.ErrMissingKey}
	}
	if r.Limit == nil {
		return drip.Request{}, inputf("%w: missing limit", drip.ErrInvalidLimit)
	}
	cost := 1.0
	if r.Cost != nil {
		cost = *r.Cost
	}
	return drip.Request{Key: r.Key, Limit: *r.Limit, Cost: cost, Reserve: r.Reserve, Lease: r.Lease}, nil
}

// Parse decodes one input line of drip replay strictly.
func Parse(b []byte) (Line, error) {
	r, err := Decode(b, LineFormat)
	if err != nil {
		return Line{}, err
	}
	l := Line{At: r.At, Op: r.Op}
	if r.Requests != nil {
		var opErr error
		if l.Op != "take" && l.Op != "peek" {
			opErr = inputf("op %q does not take requests", l.Op)
		}
		if err := r.CheckMulti(LineFormat, opErr); err != nil {
			return Line{}, err
		}
		for i, rj := range r.Requests {
			req, err := rj.ToRequest()
			if err != nil {
				return Line{}, inputf("requests[%d]: %w", i, err)
			}
			l.Requests = append(l.Requests, req)
		}
		return l, nil
	}
	if l.Op == "reset" {
		if r.Key == "" {
			return Line{}, &store.InputError{Err: store.ErrMissingKey}
		}
		l.Request.Key = r.Key
		return l, nil
	}
	req, err := r.ToRequest()
	if err != nil {
		return Line{}, err
	}
	l.Request = req
	return l, nil
}

// Op maps an op name to a bucket.Op; ok is false for "reset".
func Op(name string) (bucket.Op, bool) {
	switch name {
	case "peek":
		return bucket.Peek, true
	case "refund":
		return bucket.Refund, true
	case "reset":
		return 0, false
	}
	return bucket.Take, true
}

// Epoch returns the instant a run starting now hands the store as
// virtual time 0: the current time, truncated to the second. The store's
// times then lie near real time, so that a shared store's expiry (Redis
// TTLs, Postgres' expiry of idle rows) treats replayed buckets as it
// treats live ones. The answers do not depend on it (see Do).
func Epoch() time.Time { return time.Now().Truncate(time.Second) }

// origin is the instant a trace's time 0 stands for in its answers: the
// Unix epoch, as in drip simulate. Every grid (a fixed window's, a
// sliding window's slots) and every calendar window (days, weeks and
// months in their time zone) is placed as if the trace began there.
var origin = time.Unix(0, 0)

// Do performs one line on store at epoch + l.At, with keys prefixed by
// prefix, and returns the JSON output value. The output does not depend on
// the prefix or the epoch: the line is decided at the Unix epoch plus
// l.At (as drip simulate decides it), with a fixed window's grid derived
// from the unprefixed key, and the store is handed the same decision
// moved to epoch + l.At (see moved).
func Do(ctx context.Context, st store.Store, epoch time.Time, prefix string, l Line) (any, error) {
	at := origin.Add(l.At)
	st = moved{Store: st, by: epoch.Sub(origin)}
	// Place a fixed window's grid by the unprefixed key, then put the key
	// under the prefix, which counts toward store.MaxKeyLen.
	fix := func(r drip.Request) drip.Request {
		if r.Limit.Algorithm == drip.FixedWindow && r.Limit.Start == 0 && r.Limit.Calendar == "" {
			p := r.Limit.Period
			if p == 0 {
				p = time.Second
			}
			if r.Limit.Start = store.WindowStart(r.Key, p); r.Limit.Start == 0 {
				r.Limit.Start = p // 0 means "derive"; p is the epoch's grid
			}
		}
		if r.Key != "" {
			r.Key = prefix + r.Key
		}
		return r
	}
	if l.Op == "reset" {
		if err := (store.Prefixed{Store: st, Prefix: prefix}).Reset(ctx, l.Request.Key); err != nil {
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
		m, err := drip.Apply(ctx, st, op, at, rs...)
		if err != nil && len(rs) == 1 && store.IsInput(err) {
			// A multi-take names the request of its error, even of one.
			err = fmt.Errorf("requests[0]: %w", err)
		}
		return m, err
	}
	m, err := drip.Apply(ctx, st, op, at, fix(l.Request))
	if err != nil {
		return drip.Decision{}, err
	}
	return m.Decisions[0], nil
}

// moved is a store whose clock is by ahead of its caller's: it decides
// each call at at+by, with every grid and calendar window moved by as
// much, so that its answers are those of the store at at. A token bucket
// and a concurrency limit count from their own first request and need no
// moving; a fixed window's grid offset and a sliding window's are moved
// modulo the window and the slot, a calendar window's start (an instant)
// by by.
type moved struct {
	store.Store
	by time.Duration
}

func (m moved) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	own := make([]bucket.Prepared, len(items))
	copy(own, items)
	by := int64(m.by)
	for i := range own {
		p := &own[i].Params
		switch p.Kind {
		case bucket.Window:
			p.Start = addMod(p.Start, by, p.Period)
		case bucket.Sliding:
			p.Start = addMod(p.Start, by, p.Sliding().Slot())
		case bucket.Calendar:
			p.Start += by
		}
	}
	return m.Store.Apply(ctx, op, at.Add(m.by), own, results)
}

// addMod is (a + b) modulo m, from 0 to m-1, for m > 0, without
// overflowing.
func addMod(a, b, m int64) int64 {
	a, b = a%m, b%m
	if a < 0 {
		a += m
	}
	if b < 0 {
		b += m
	}
	if a >= m-b {
		return a - (m - b)
	}
	return a + b
}

// Run reads lines from r and writes one output line per input line to w.
// Bad lines print {"error": "..."} and the run goes on; a failing store
// also prints an error line for that request. Run returns only I/O errors.
func Run(ctx context.Context, st store.Store, prefix string, r io.Reader, w io.Writer) error {
	return RunAt(ctx, st, Epoch(), prefix, r, w)
}

// RunAt is Run with virtual time 0 at epoch.
func RunAt(ctx context.Context, st store.Store, epoch time.Time, prefix string, r io.Reader, w io.Writer) error {
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
			out, err = Do(ctx, st, epoch, prefix, l)
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
