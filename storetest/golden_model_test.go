package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/store"
)

// modelStore is the exact Model behind the store.Store interface, so that
// replay.Do can run a trace on it with the same line handling (key
// prefixes, fixed-window grids) as on a store. Before each line the test
// sets follow to the golden decisions; each call records the model's
// exact decisions for the test to compare.
type modelStore struct {
	m      *Model
	follow []drip.Decision
	want   []ModelDecision
	params []bucket.Params
}

// Apply decides items, prepared by drip.Apply; the model's own reading
// of the requests (Model.Prepare) was checked before (checkWithModel).
func (s *modelStore) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	return s.decide(op, at, items, len(items) > 1)
}

func (s *modelStore) Caps() store.Caps { return store.Caps{} }

// decide is CompareWithModel's step: each request decided exactly
// (following the golden answer only at a boundary within Tolerance),
// then a take applied all or nothing, a refund always.
func (s *modelStore) decide(op bucket.Op, at time.Time, ps []bucket.Prepared, multi bool) error {
	if len(s.follow) != len(ps) {
		return fmt.Errorf("the golden line has %d decisions, the input %d requests", len(s.follow), len(ps))
	}
	s.want, s.params = make([]ModelDecision, len(ps)), make([]bucket.Params, len(ps))
	all := true
	for i, p := range ps {
		s.want[i] = s.m.Apply(op, p, at, false, &s.follow[i], Tolerance)
		s.params[i] = p.Params
		all = all && s.want[i].Allowed
	}
	if op == bucket.Refund || (op == bucket.Take && (all || !multi)) {
		for i, p := range ps {
			if s.want[i].Allowed || op == bucket.Refund {
				s.m.Apply(op, p, at, true, &s.follow[i], Tolerance)
			}
		}
	}
	return nil
}

func (s *modelStore) Reset(ctx context.Context, key string) error {
	s.m.Reset(key)
	return nil
}

// checkWithModel replays a trace's input on the exact model and checks
// every golden line: a decision (or each decision of a multi-take) within
// Tolerance of the exact one, with the all-or-nothing verdict; an error
// line exactly where the input is refused (the golden message containing
// the refusal's); {"reset":true} for a reset.
func checkWithModel(t *testing.T, name string, in, golden []string) {
	t.Helper()
	if len(in) != len(golden) {
		t.Fatalf("%s: %d lines, %d golden lines", name, len(in), len(golden))
	}
	ms := &modelStore{m: NewModel()}
	epoch := base()
	for i := range in {
		where := fmt.Sprintf("%s line %d: %s\n golden %s", name, i+1, in[i], golden[i])
		var g struct {
			Error *string `json:"error"`
			Reset bool    `json:"reset"`
		}
		if err := json.Unmarshal([]byte(golden[i]), &g); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		l, err := replay.Parse([]byte(in[i]))
		ms.follow, ms.want = nil, nil
		var m drip.Multi
		if err == nil {
			switch {
			case l.Op == "reset":
			case l.Requests != nil:
				if json.Unmarshal([]byte(golden[i]), &m) == nil {
					ms.follow = m.Decisions
				}
			default:
				var d drip.Decision
				if json.Unmarshal([]byte(golden[i]), &d) == nil {
					ms.follow = []drip.Decision{d}
				}
			}
			// The model reads the requests itself: an input it refuses
			// must be refused, with the golden error.
			if op, ok := replay.Op(l.Op); ok {
				rs := l.Requests
				if rs == nil {
					rs = []drip.Request{l.Request}
				}
				_, err = ms.m.PrepareMulti(op, rs)
			}
			if err == nil {
				_, err = replay.Do(t.Context(), ms, epoch, "", l)
			}
		}
		switch {
		case err != nil:
			if g.Error == nil || !strings.Contains(*g.Error, err.Error()) {
				t.Errorf("%s\n the input is refused: %v", where, err)
			}
		case g.Error != nil:
			t.Errorf("%s\n the exact model decides the line", where)
		case l.Op == "reset":
			if !g.Reset {
				t.Errorf("%s\n want {\"reset\":true}", where)
			}
		default:
			all := true
			for j, w := range ms.want {
				all = all && w.Allowed
				if msg := compare(ms.follow[j], w, ms.params[j], epoch.Add(l.At)); msg != "" {
					t.Errorf("%s\n decision %d: %s", where, j, msg)
				}
			}
			if l.Requests != nil && m.Allowed != all {
				t.Errorf("%s\n the multi-take's verdict is not the exact model's (%v)", where, all)
			}
		}
	}
}

// TestGoldenExact checks every golden output, hand-checked or generated,
// against the exact model on every run.
func TestGoldenExact(t *testing.T) {
	for _, name := range TraceNames() {
		t.Run(name, func(t *testing.T) {
			in, golden := ReadTrace(name)
			checkWithModel(t, name, in, golden)
		})
	}
}
