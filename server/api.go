package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/redact"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// The decision API: POST /v1/take, /v1/peek, /v1/refund and /v1/reset,
// with the request and decision shapes of drip replay (docs/api.md), minus
// "at" and "op" (the time is the store's, the op is the path); and for
// concurrency limits POST /v1/acquire (a take under a lease ID the server
// makes, returned as "lease" when allowed) and /v1/release (a refund of
// the request's "lease"; a release gives back slots only, so its requests
// on token buckets give back nothing). An adaptive rule's slots are held
// in this instance by the same acquire and release (slots.go); a body's
// "priority" names its class.
//
// A request names its bucket in one of two ways:
//   - inline: {"key": "user:1", "limit": {"rate": 10, "burst": 20}, "cost": 1}
//     The bucket is InlinePrefix + key, apart from the rules' buckets.
//   - by rule: {"rule": "free", "values": ["k-123"], "cost": 1}
//     The rule's limit, and the bucket the middleware and gateway use for
//     a request with those key values. "values" lists one value per entry
//     of the rule's limit_keys, in order, or maps each limit key to its
//     value: {"values": {"header:x-api-key": "k-123"}}. Without "cost" the
//     rule's fixed_cost (cost_source fixed) or default_cost applies.
//
// A multi-take (/v1/take and /v1/peek) replaces the single request by
// "requests": [...] (at most replay.MaxRequests, 100), each inline or by
// rule, all-or-nothing.
//
// Answers: 200 with a decision (allowed, tokens, remaining, limit,
// retry_after, reset_after; a denial is a 200 with "allowed": false), a
// multi-take's {"allowed", "retry_after", "results"}, or {"reset": true};
// 400 {"error": "..."} for a body that is not valid (bad JSON, unknown
// field, bad limit or cost, missing key or one over MaxInlineKeyLen, cost
// over burst), 404 for an
// unknown rule, 413 for a body over maxBody (256 KiB), 503 when the store fails or
// times out.

// maxBody bounds a decision API or admin reset request body. The largest
// body of use, a multi-take of 100 requests each with a key of 1 KiB and a
// limit inline, is about 130 KiB (1,024 bytes of key and some 200 of JSON
// around it per request): 256 KiB leaves it room, and a thousand
// connections each holding a body cost a quarter of a gigabyte at most.
const maxBody = 256 << 10

// httpError is an error with the HTTP status that reports it: 404, 405,
// 413. Bad input (400) is a *store.InputError (inputf).
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func errorf(status int, format string, args ...any) error {
	return &httpError{status, fmt.Sprintf(format, args...)}
}

// inputf is bad input: 400.
func inputf(format string, args ...any) error {
	return &store.InputError{Err: fmt.Errorf(format, args...)}
}

// decode reads a decision API body (or an admin reset's) with the
// protocol's one parser, strictly: unknown fields and trailing data are
// errors.
func decode(w http.ResponseWriter, r *http.Request) (replay.Raw, error) {
	bp := bodyBufs.Get().(*[]byte)
	defer bodyBufs.Put(bp)
	b, err := readBody(w, r, maxBody, *bp)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return replay.Raw{}, errorf(http.StatusRequestEntityTooLarge, "body over %d bytes", maxBody)
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			return replay.Raw{}, errorf(http.StatusRequestTimeout, "reading body: the body did not arrive in time")
		}
		return replay.Raw{}, inputf("reading body: %v", err)
	}
	// The request read keeps nothing of b (its strings are copies), so
	// the buffer goes back to the pool when decode returns.
	return replay.Decode(b, replay.BodyFormat)
}

// bodyBufs holds the buffers decode reads bodies of up to 1 KiB into,
// the size of nearly every decision API request; a larger body gets a
// buffer of its own, which is not kept.
var bodyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1<<10); return &b }}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	status := http.StatusServiceUnavailable
	var he *httpError
	switch {
	case errors.As(err, &he):
		status = he.status
	case store.IsInput(err):
		status = http.StatusBadRequest
	case store.IsAnswered(err):
		// The store answered, refusing this request's values: a fault
		// of drip or the store, this request's alone. Asking again
		// gets the same answer, so no Retry-After.
		status = http.StatusInternalServerError
		err = fmt.Errorf("store refused the request: %w", err)
	default:
		// The store failed, was too slow, or the breaker skipped it:
		// the breaker probes it again within its cool-down.
		err = fmt.Errorf("store: %w", err)
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, map[string]string{"error": redact.Text(err.Error())})
}

// apiHandler serves the decision API.
func (s *Server) apiHandler() http.Handler {
	mux := http.NewServeMux()
	for _, op := range []string{"take", "peek", "refund", "reset", "acquire", "release"} {
		mux.Handle("/v1/"+op, s.decideHandler(op))
	}
	mux.HandleFunc(forwardAuthPath, s.forwardAuth) // forwardauth.go
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "not found: the decision API is POST /v1/take, /v1/peek, /v1/refund, /v1/reset, /v1/acquire and /v1/release; forward auth is GET /v1/forward-auth"})
	})
	return mux
}

func (s *Server) decideHandler(opName string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "use POST"})
			return
		}
		b, err := decode(w, r)
		if err != nil {
			writeError(w, err)
			return
		}
		out, err := s.decide(r.Context(), opName, b)
		if err != nil {
			writeError(w, err)
			return
		}
		if d, ok := out.(*drip.Decision); ok {
			writeDecision(w, *d)
			return
		}
		writeJSON(w, http.StatusOK, out)
	})
}

// decide performs one decision API body: takes, peeks and refunds through
// the engine (its deadline, its breaker), a reset under the same deadline.
func (s *Server) decide(ctx context.Context, opName string, b replay.Raw) (any, error) {
	if err := checkWait(b, opName); err != nil {
		return nil, err
	}
	class, err := bodyPriority(b) // slots.go
	if err != nil {
		return nil, err
	}
	if r, ok := s.adaptiveRule(b.ReqJSON); ok && b.Requests == nil {
		return s.adaptive(ctx, opName, b, r, class)
	}
	if b.Requests != nil {
		var opErr error
		if opName != "take" && opName != "peek" && opName != "acquire" && opName != "release" {
			opErr = inputf("/v1/%s does not take requests: a multi-take is /v1/take, /v1/peek, /v1/acquire or /v1/release", opName)
		}
		if err := b.CheckMulti(replay.BodyFormat, opErr); err != nil {
			return nil, err
		}
		rs := make([]drip.Request, len(b.Requests))
		var one [1]target // a multi-take of one, without an allocation
		ts := one[:]
		if len(b.Requests) > 1 {
			ts = make([]target, len(b.Requests))
		}
		for i, it := range b.Requests {
			r, t, err := s.request(it, opName)
			if err != nil {
				return nil, prefixed(fmt.Sprintf("requests[%d]: ", i), err)
			}
			rs[i], ts[i] = r, t
		}
		m, err := s.apply(ctx, apiOp(opName), b.Wait, class, b.Requests, rs, ts, true)
		if err != nil {
			return nil, err
		}
		if opName == "acquire" {
			return acquiredMulti(m, rs), nil
		}
		return m, nil
	}

	r, t, err := s.request(b.ReqJSON, opName)
	if err != nil {
		return nil, err
	}
	if opName == "reset" {
		ctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
		defer cancel()
		if err := s.store.Reset(ctx, r.Key); err != nil {
			return nil, err
		}
		return map[string]bool{"reset": true}, nil
	}
	rs := []drip.Request{r}
	m, err := s.apply(ctx, apiOp(opName), b.Wait, class, []replay.ReqJSON{b.ReqJSON}, rs, []target{t}, false)
	if err != nil {
		return nil, err
	}
	if opName == "acquire" {
		return acquired{d: m.Decisions[0], lease: leaseOf(m.Allowed, rs[0])}, nil
	}
	return &m.Decisions[0], nil // a pointer: no copy boxed into the interface
}

// target is what a decision API request counts under: its rule's name
// and mode, or "inline" in enforce mode for an inline limit; and the
// plan its limit is decided by: its rule's, compiled once (nil: its
// limit is compiled for the request, an inline limit or an override).
type target struct {
	name string
	mode rules.Mode
	plan *engine.Plan
}

// inline is what requests with an inline limit count under.
var inline = target{name: "inline", mode: rules.Enforce}

// apply decides requests through the engine and counts the takes, each
// prepared once under its plan (target.plan). Bad input is refused
// before any request is decided: by the engine's one store call, which
// prepares every request before it asks the store, or, where the
// requests are decided in parts (shadow rules, items that may wait) or
// a multi-take of one request names its index, by Engine.Prepare, whose
// requests the parts then decide.
// The requests of shadow-mode rules never deny: a take or a peek
// decides the others first, all or nothing, then the shadow ones, taken
// when the others were allowed and else peeked, as the rules decide on
// HTTP requests; their decisions say allowed, with their buckets' state,
// and their metrics count them in shadow mode (a denial as a shadow
// denial, a store failure as error_allowed). A shadow acquire that its
// bucket refused holds no lease (rs[i].Lease is cleared). Takes are
// counted, and so are the failures of a multi-take's other ops. A take
// that asks to wait (wait > 0) waits through s.take, by class (-1: each
// rule's), the shadow requests never.
func (s *Server) apply(ctx context.Context, op bucket.Op, wait time.Duration, class int, its []replay.ReqJSON, rs []drip.Request, ts []target, multi bool) (drip.Multi, error) {
	counted := func(err error) bool { return op == bucket.Take || (multi && err != nil) }
	var enf, sh []int       // indexes of rs
	var one [1]*engine.Plan // a single request's plans, without an allocation
	var plans []*engine.Plan
	for i, t := range ts {
		if t.mode == rules.Shadow && (op == bucket.Take || op == bucket.Peek) {
			sh = append(sh, i)
		} else {
			enf = append(enf, i)
		}
		if t.plan != nil && plans == nil {
			plans = one[:]
			if len(ts) > 1 {
				plans = make([]*engine.Plan, len(ts))
			}
		}
		if plans != nil {
			plans[i] = t.plan
		}
	}
	set := s.rules()
	if len(sh) == 0 && !waits(set, op, wait, its, nil) && !(multi && len(rs) == 1) {
		m, err := s.eng.Apply(ctx, op, rs, plans)
		if counted(err) {
			for i, t := range ts {
				s.count(t, rs[i], m, i, err)
			}
		}
		return m, err
	}
	p, err := s.eng.Prepare(op, rs, plans, multi)
	if err != nil {
		return drip.Multi{}, err
	}
	if len(sh) == 0 {
		m, err := s.take(ctx, set, op, wait, class, its, p, nil)
		if counted(err) {
			for i, t := range ts {
				s.count(t, rs[i], m, i, err)
			}
		}
		return m, err
	}
	m := drip.Multi{Allowed: true, Decisions: make([]drip.Decision, len(rs))}
	if len(enf) > 0 {
		em, err := s.take(ctx, set, op, wait, class, its, p, enf)
		if counted(err) {
			for j, i := range enf {
				s.count(ts[i], rs[i], em, j, err)
			}
		}
		if err != nil {
			return drip.Multi{}, err
		}
		m.Allowed, m.RetryAfter = em.Allowed, em.RetryAfter
		for j, i := range enf {
			m.Decisions[i] = em.Decisions[j]
		}
	}
	shOp := op
	if !m.Allowed {
		shOp = bucket.Peek
	}
	sm, err := p.Apply(ctx, shOp, sh)
	for j, i := range sh {
		var d drip.Decision
		if err == nil {
			d = sm.Decisions[j]
		}
		if op == bucket.Take {
			s.countShadow(ts[i].name, d.Allowed, shOp == bucket.Take && sm.Allowed, err)
		}
		if err != nil || shOp != bucket.Take || !sm.Allowed {
			rs[i].Lease = "" // nothing acquired
		}
		d.Allowed, d.RetryAfter = true, 0
		m.Decisions[i] = d
	}
	return m, nil
}

// apiOp is the store op of a decision API path: acquire is a take (of
// leases the server names), release a refund (of a named lease).
func apiOp(opName string) bucket.Op {
	switch opName {
	case "acquire":
		return bucket.Take
	case "release":
		return bucket.Refund
	}
	op, _ := replay.Op(opName)
	return op
}

// acquired is a decision of /v1/acquire: the decision's fields and, when
// it acquired a lease, "lease", the ID to release it with; when it was
// denied for its class of priority, "shed", the class's name.
type acquired struct {
	d     drip.Decision
	lease string
	shed  string
}

func (a acquired) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(a.d)
	if err != nil {
		return b, err
	}
	for _, f := range [...]struct{ name, v string }{{"lease", a.lease}, {"shed", a.shed}} {
		if f.v != "" {
			v, _ := json.Marshal(f.v)
			b = append(append(append(append(b[:len(b)-1], `,"`...), f.name...), `":`...), v...)
			b = append(b, '}')
		}
	}
	return b, nil
}

// leaseOf is the lease r acquired: its ID when the take was allowed.
func leaseOf(allowed bool, r drip.Request) string {
	if !allowed {
		return ""
	}
	return r.Lease
}

// acquiredMulti is a multi-take of /v1/acquire: its results carry the
// leases acquired.
func acquiredMulti(m drip.Multi, rs []drip.Request) any {
	res := make([]acquired, len(rs))
	for i, r := range rs {
		res[i] = acquired{d: m.Decisions[i], lease: leaseOf(m.Allowed, r)}
	}
	return struct {
		Allowed    bool       `json:"allowed"`
		RetryAfter float64    `json:"retry_after"`
		Results    []acquired `json:"results"`
	}{m.Allowed, m.RetryAfter.Seconds(), res}
}

// count reports a take's decision (or failure) on t to the observer,
// in the engine's vocabulary, and its key (request r, the i-th of m) to
// the key observer. Bad input is no decision.
func (s *Server) count(t target, r drip.Request, m drip.Multi, i int, err error) {
	ev := engine.Denied
	switch {
	case err != nil && store.IsInput(err):
		return
	case err != nil:
		ev = engine.Failed
	case m.Allowed:
		ev = engine.Allowed
	}
	s.eng.Observer().Decision(t.name, t.mode, ev)
	if k := s.eng.Keys(); k != nil {
		// A KeyObserver keeps nothing of the Item: one from a pool, not
		// an allocation of a few hundred bytes a request.
		it := countItems.Get().(*engine.Item)
		*it = engine.Item{Key: r.Key, Limit: r.Limit, Cost: r.Cost}
		if err == nil && i < len(m.Decisions) {
			it.Decision, it.Decided = m.Decisions[i], true
		}
		k.Key(t.name, t.mode, ev, it)
		*it = engine.Item{}
		countItems.Put(it)
	}
}

var countItems = sync.Pool{New: func() any { return new(engine.Item) }}

// countShadow reports a take of a shadow-mode rule: its bucket's own
// answer (allowed), and whether it was taken (the other requests were
// allowed, and so were the shadow ones together), as the engine counts
// a shadow rule on HTTP requests.
func (s *Server) countShadow(rule string, allowed, taken bool, err error) {
	ev := engine.NotTaken
	switch {
	case err != nil && store.IsInput(err):
		return
	case err != nil:
		ev = engine.ErrorAllowed
	case !allowed:
		ev = engine.Denied
	case taken:
		ev = engine.Allowed
	}
	s.eng.Observer().Decision(rule, rules.Shadow, ev)
}

// request turns one item into a drip.Request and what its metrics count
// under. For reset only the key matters.
func (s *Server) request(it replay.ReqJSON, opName string) (drip.Request, target, error) {
	r, t, err := s.request1(it, opName)
	if err != nil {
		return r, t, err
	}
	if opName == "release" && r.Limit.Algorithm != drip.Concurrency {
		// A release gives back slots only: the tokens of the acquire's
		// token buckets are spent. Such a request gives back nothing
		// and answers its bucket as it is.
		r.Cost = 0
	}
	if opName != "acquire" {
		return r, t, nil
	}
	if it.Lease != "" {
		return drip.Request{}, target{}, inputf("%v: /v1/acquire names its leases itself; give none", store.ErrInvalidLease)
	}
	if r.Limit.Algorithm == drip.Concurrency {
		r.Lease = store.NewLeaseID()
	}
	return r, t, nil
}

// request1 is request without acquire's leases.
func (s *Server) request1(it replay.ReqJSON, opName string) (drip.Request, target, error) {
	if rule := ruleOf(it); rule != "" {
		if it.Key != "" || it.Limit != nil {
			return drip.Request{}, target{}, inputf("a request by rule has values instead of key and limit")
		}
		r, t, err := s.ruleRequest(rule, it.Values)
		if err != nil {
			return drip.Request{}, target{}, err
		}
		if it.Cost != nil {
			r.Cost = *it.Cost
		}
		r.Lease = it.Lease
		if it.Reserve && r.Limit.MaxReserved == 0 {
			// A reservation without a bound could lock a key out for
			// ages: by rule, only the debt the rule allows.
			return drip.Request{}, target{}, inputf("rule %q allows no reservations: its algorithm_config sets no max_reserved", rule)
		}
		r.Reserve = it.Reserve
		return r, t, nil
	}
	if it.Values != nil {
		return drip.Request{}, target{}, inputf("values need a rule")
	}
	if it.Key == "" {
		return drip.Request{}, target{}, inputf("%v: give key and limit, or rule and values", store.ErrMissingKey)
	}
	if len(it.Key) > MaxInlineKeyLen {
		return drip.Request{}, target{}, inputf("%v: key is %d bytes, at most %d", store.ErrKeyTooLong, len(it.Key), MaxInlineKeyLen)
	}
	if opName == "reset" {
		if it.Limit != nil || it.Cost != nil || it.Reserve || it.Lease != "" {
			return drip.Request{}, target{}, inputf("a reset takes only key (or rule and values)")
		}
		return drip.Request{Key: InlinePrefix + it.Key}, inline, nil
	}
	r, err := it.ToRequest()
	r.Key = InlinePrefix + r.Key
	return r, inline, err
}

// ruleOf is the rule an item names, or "".
func ruleOf(it replay.ReqJSON) string {
	if it.Rule == nil {
		return ""
	}
	return *it.Rule
}

// InlinePrefix is put before the key of every request with an inline limit,
// so that a caller of the decision API, who picks the limit, cannot reach
// (drain, refund or reset) the buckets of the rules: those are reached by
// rule name and values only, under the rule's own limit.
const InlinePrefix = "inline:"

// MaxInlineKeyLen is the longest inline key, in bytes: store.MaxKeyLen less
// InlinePrefix. A longer one is a 400.
const MaxInlineKeyLen = store.MaxKeyLen - len(InlinePrefix)

func prefixed(p string, err error) error {
	var he *httpError
	if errors.As(err, &he) {
		return &httpError{he.status, p + he.msg}
	}
	if store.IsInput(err) {
		return inputf("%s%w", p, err)
	}
	return err
}
