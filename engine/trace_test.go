package engine_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// recorder returns a tracer provider that keeps every ended span in
// memory, and the recorder to read them.
func recorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, rec
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// noKeys fails if a span's attributes, events or status quote a client
// identity: bucket keys stay out of traces.
func noKeys(t *testing.T, spans []sdktrace.ReadOnlySpan, ids ...string) {
	t.Helper()
	for _, s := range spans {
		var all []string
		for _, kv := range s.Attributes() {
			all = append(all, kv.Value.String())
		}
		for _, ev := range s.Events() {
			for _, kv := range ev.Attributes {
				all = append(all, kv.Value.String())
			}
		}
		all = append(all, s.Status().Description)
		for _, v := range all {
			for _, id := range ids {
				if strings.Contains(v, id) {
					t.Errorf("span %s holds the client identity %q: %q", s.Name(), id, v)
				}
			}
		}
	}
}

const traceRules = `{"rules": [
  {"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1m", "burst": 1}},
  {"name": "watch", "mode": "shadow", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 100, "period": "1m"}}]}`

// A decision is one drip.decide span, child of the caller's span, with
// the rules, the outcome and the store's kind; each store call under it
// is a drip.store span, its child.
func TestTraceDecide(t *testing.T) {
	tp, rec := recorder(t)
	set, err := rules.Parse([]byte(traceRules), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New()
	defer store.Close()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e := engine.New(store, engine.WithClock(func() time.Time { return now }), engine.WithTracerProvider(tp))
	defer e.Close()
	rs := e.Compile(set)

	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	for _, want := range []bool{true, false} {
		if out := e.Decide(ctx, rs, values{"header:x-api-key": "client-7"}); out.Allowed != want {
			t.Fatalf("allowed %v, want %v", out.Allowed, want)
		}
	}
	parent.End()

	spans := rec.Ended()
	var decides []sdktrace.ReadOnlySpan
	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID().String()] = s
		if s.Name() == engine.SpanDecide {
			decides = append(decides, s)
		}
	}
	if len(decides) != 2 {
		t.Fatalf("%d drip.decide spans, want 2", len(decides))
	}
	for i, d := range decides {
		if d.Parent().SpanID() != parent.SpanContext().SpanID() || d.SpanContext().TraceID() != parent.SpanContext().TraceID() {
			t.Errorf("decide %d: parent %s, want the caller's span %s", i, d.Parent().SpanID(), parent.SpanContext().SpanID())
		}
		a := attrs(d)
		if got := a["drip.rules"].AsStringSlice(); !slices.Equal(got, []string{"per-key", "watch"}) {
			t.Errorf("decide %d: drip.rules %q", i, got)
		}
		if a["drip.store"].AsString() != "memstore" {
			t.Errorf("decide %d: drip.store %q, want memstore", i, a["drip.store"].AsString())
		}
		wantEvents := []string{"allowed", "allowed"}
		if i == 1 {
			wantEvents = []string{"denied", "allowed"} // the shadow rule's peek
		}
		if got := a["drip.events"].AsStringSlice(); !slices.Equal(got, wantEvents) {
			t.Errorf("decide %d: drip.events %q, want %q", i, got, wantEvents)
		}
		allowed := i == 0
		if a["drip.allowed"].AsBool() != allowed {
			t.Errorf("decide %d: drip.allowed %v", i, a["drip.allowed"].AsBool())
		}
		if allowed {
			if a["drip.status"].AsInt64() != 0 || a["drip.reason"].Type() != attribute.EMPTY {
				t.Errorf("allowed decide: %v", a)
			}
		} else if a["drip.status"].AsInt64() != 429 || a["drip.reason"].AsString() != engine.ReasonTokenBucket || a["drip.denied_by"].AsString() != "per-key" {
			t.Errorf("denied decide: %v", a)
		}
	}
	// Each decision: one take of the enforce rule, then the shadow rule's
	// take (allowed) or peek (denied).
	wantOps := map[string][]string{decides[0].SpanContext().SpanID().String(): {"take", "take"},
		decides[1].SpanContext().SpanID().String(): {"take", "peek"}}
	gotOps := map[string][]string{}
	for _, s := range spans {
		if s.Name() != engine.SpanStore {
			continue
		}
		p := s.Parent().SpanID().String()
		if _, ok := byID[p]; !ok || byID[p].Name() != engine.SpanDecide {
			t.Errorf("store span's parent %s is not a decide span", p)
		}
		a := attrs(s)
		if a["drip.keys"].AsInt64() != 1 || a["drip.store"].AsString() != "memstore" || s.Status().Code == codes.Error {
			t.Errorf("store span: %v %v", a, s.Status())
		}
		gotOps[p] = append(gotOps[p], a["drip.op"].AsString())
	}
	for id, want := range wantOps {
		if !slices.Equal(gotOps[id], want) {
			t.Errorf("store ops under decide %s: %q, want %q", id, gotOps[id], want)
		}
	}
	noKeys(t, spans, "client-7")
}

// down is a store that is down: every call fails as a lost connection
// would, after checking its input as every store does.
type down struct{}

var errDown = errors.New("dial tcp 127.0.0.1:1: connection refused")

func (down) Apply(context.Context, bucket.Op, time.Time, []bucket.Prepared, []bucket.Result) error {
	return errDown
}

func (down) Caps() store.Caps { return store.Caps{} }

func (down) Reset(context.Context, string) error { return errDown }

// A failing store call records its error on the store span; once the
// circuit breaker opens, the calls it skips say so; the decision says
// the store failed (and on_error, here allow, decided).
func TestTraceStoreError(t *testing.T) {
	tp, rec := recorder(t)
	set, err := rules.Parse([]byte(`{"circuit_breaker": {"failures": 2, "cooldown": "1m"}, "rules": [
	  {"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1m"}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e := engine.New(down{}, engine.WithClock(func() time.Time { return now }), engine.WithTracerProvider(tp))
	defer e.Close()
	rs := e.Compile(set)
	for range 3 {
		if out := e.Decide(context.Background(), rs, values{"header:x-api-key": "client-7"}); !out.Allowed || out.Err == nil {
			t.Fatalf("store down, on_error allow: %+v", out)
		}
	}
	var failed, skipped, decides int
	for _, s := range rec.Ended() {
		a := attrs(s)
		switch s.Name() {
		case engine.SpanDecide:
			decides++
			if !a["drip.store_failed"].AsBool() || !a["drip.allowed"].AsBool() || !slices.Equal(a["drip.events"].AsStringSlice(), []string{"error_allowed"}) {
				t.Errorf("decide with the store down: %v", a)
			}
		case engine.SpanStore:
			if s.Status().Code != codes.Error {
				t.Errorf("failed store call with status %v", s.Status())
			}
			if a["drip.breaker"].AsString() == engine.BreakerOpen {
				skipped++
				if s.Status().Description != engine.ErrBreakerOpen.Error() {
					t.Errorf("skipped call's status: %q", s.Status().Description)
				}
				continue
			}
			failed++
			var recorded bool
			for _, ev := range s.Events() {
				for _, kv := range ev.Attributes {
					if kv.Key == "exception.message" && kv.Value.AsString() == errDown.Error() {
						recorded = true
					}
				}
			}
			if !recorded || s.Status().Description != errDown.Error() {
				t.Errorf("failed store call without its error: %v %v", s.Events(), s.Status())
			}
		}
	}
	if decides != 3 || failed != 2 || skipped != 1 {
		t.Fatalf("%d decisions, %d failed calls, %d skipped, want 3, 2 (the breaker's failures) and 1", decides, failed, skipped)
	}
	noKeys(t, rec.Ended(), "client-7")
}

// Apply and Step (the decision API's and Envoy's calls) get store spans
// too; a bad input is marked without its message, which may quote a key.
func TestTraceApply(t *testing.T) {
	tp, rec := recorder(t)
	ms := memstore.New()
	defer ms.Close()
	e := engine.New(ms, engine.WithTracerProvider(tp))
	defer e.Close()
	ctx := context.Background()
	if _, err := e.Apply(ctx, bucket.Peek, []drip.Request{{Key: "a", Limit: drip.PerSecond(1)}, {Key: "b", Limit: drip.PerSecond(1)}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Apply(ctx, bucket.Take, []drip.Request{{Key: "secret-key", Limit: drip.PerSecond(1), Cost: -1}}, nil); !store.IsInput(err) {
		t.Fatalf("negative cost: %v", err)
	}
	a := engine.NewApplied(&rules.Rule{Name: "a", Limit: drip.PerSecond(1)})
	a.Key, a.Cost, a.Mode = "a", 1, engine.Refund
	if err := e.DecideItems(ctx, []engine.Applied{a}).Err; err != nil {
		t.Fatal(err)
	}
	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	for i, want := range []struct {
		op   string
		keys int64
		code codes.Code
	}{{"peek", 2, codes.Unset}, {"take", 1, codes.Error}, {"refund", 1, codes.Unset}} {
		a := attrs(spans[i])
		if spans[i].Name() != engine.SpanStore || a["drip.op"].AsString() != want.op || a["drip.keys"].AsInt64() != want.keys || spans[i].Status().Code != want.code {
			t.Errorf("span %d: %s %v %v, want %+v", i, spans[i].Name(), a, spans[i].Status(), want)
		}
	}
	noKeys(t, spans, "secret-key")
}

// Without a tracer provider (or with nil) the engine makes no spans.
func TestTraceOff(t *testing.T) {
	tp, rec := recorder(t)
	store := memstore.New()
	defer store.Close()
	set, err := rules.Parse([]byte(traceRules), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]engine.Option{nil, {engine.WithTracerProvider(tp), engine.WithTracerProvider(nil)}} {
		e := engine.New(store, opts...)
		ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
		e.Decide(ctx, e.Compile(set), values{"header:x-api-key": "k"})
		parent.End()
		e.Close()
	}
	for _, s := range rec.Ended() {
		if s.Name() != "request" {
			t.Errorf("span %s with tracing off", s.Name())
		}
	}
}

// The drip.store attribute names the store's kind (Caps.Name) through
// every wrapper: Prefixed and Sharded too, which once read "store".
func TestStoreName(t *testing.T) {
	ms := memstore.New()
	defer ms.Close()
	for _, s := range []store.Store{ms, store.Separately{Store: ms}, wrapped{ms},
		store.Prefixed{Store: ms, Prefix: "p:"}, store.Sharded{Store: ms, N: 2}} {
		tp, rec := recorder(t)
		e := engine.New(s, engine.WithTracerProvider(tp))
		if _, err := e.Apply(context.Background(), bucket.Take, []drip.Request{{Key: "k", Limit: drip.PerSecond(10), Cost: 1}}, nil); err != nil {
			t.Fatal(err)
		}
		e.Close()
		for _, sp := range rec.Ended() {
			if k := attrs(sp)["drip.store"].AsString(); k != "memstore" {
				t.Errorf("%T: %s span's drip.store %q, want memstore", s, sp.Name(), k)
			}
		}
	}
}

type wrapped struct{ store.Store }

// Caps are the store's, but not InProcess: it stands for a store on a
// server, whose calls get a deadline.
func (w wrapped) Caps() store.Caps {
	c := w.Store.Caps()
	c.InProcess = false
	return c
}
