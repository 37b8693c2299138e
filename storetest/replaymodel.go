package storetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/store"
)

// encodeLine writes l in the replay format.
func encodeLine(l replay.Line) string {
	type req struct {
		Key     string      `json:"key"`
		Cost    *float64    `json:"cost,omitempty"`
		Reserve bool        `json:"reserve,omitempty"`
		Limit   *drip.Limit `json:"limit,omitempty"`
	}
	conv := func(r drip.Request) req {
		c, lim := r.Cost, r.Limit
		return req{Key: r.Key, Cost: &c, Reserve: r.Reserve, Limit: &lim}
	}
	m := map[string]any{"at": json.Number(fmt.Sprintf("%.3f", l.At.Seconds())), "op": l.Op}
	switch {
	case l.Requests != nil:
		var rs []req
		for _, r := range l.Requests {
			rs = append(rs, conv(r))
		}
		m["requests"] = rs
	case l.Op == "reset":
		m["key"] = l.Request.Key
	default:
		r := conv(l.Request)
		m["key"], m["cost"], m["limit"] = r.Key, r.Cost, r.Limit
		if r.Reserve {
			m["reserve"] = true
		}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// RunReplayRandom writes random traces in the replay format, runs them
// through the replay protocol (what drip replay does) on the store, and
// checks every output line against the exact Model. The traces include
// refunds above the burst and reservations that can never fit, which must
// be error lines.
func RunReplayRandom(t *testing.T, newStore NewStore, seeds, n int) {
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			CompareReplayWithModel(t, newStore(t), RandomLines(uint64(1000+seed), n))
		})
	}
}

// RunReplayWindows runs random traces of sliding and calendar windows
// through the replay protocol on the store, when it holds them, and
// checks every output line against the exact Model at the Unix epoch:
// replay places their slots and calendar windows as if the trace began
// there, whenever it runs (base is the next whole hour, which a slot of
// 3s/7 does not divide).
func RunReplayWindows(t *testing.T, newStore NewStore, seeds, n int) {
	caps := newStore(t).Caps()
	for seed := range seeds {
		if caps.Sliding {
			t.Run(fmt.Sprint("sliding", seed), func(t *testing.T) {
				CompareReplayWithModel(t, newStore(t), RandomWindowLines(uint64(2000+seed), n))
			})
		}
		if caps.Calendar {
			t.Run(fmt.Sprint("calendar", seed), func(t *testing.T) {
				lines := RandomCalendarLines(uint64(2000+seed), n, time.Unix(0, 0))
				for i := range lines {
					lines[i].At = lines[i].At.Truncate(ms) // as encodeLine writes it
				}
				CompareReplayWithModel(t, newStore(t), lines)
			})
		}
	}
}

// CompareReplayWithModel replays lines on the store and fails on any
// output line the exact Model disagrees with. Replay's output does not
// depend on its epoch or key prefix (it is as if the trace began at the
// Unix epoch, with fixed-window grids derived from the unprefixed keys), so
// the model runs at the Unix epoch on the unprefixed keys.
func CompareReplayWithModel(t *testing.T, st store.Store, lines []replay.Line) {
	t.Helper()
	var in strings.Builder
	for _, l := range lines {
		in.WriteString(encodeLine(l) + "\n")
	}
	var out bytes.Buffer
	if err := replay.RunAt(ctx(t), st, base(), prefix(), strings.NewReader(in.String()), &out); err != nil {
		t.Fatal(err)
	}
	outs := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(outs) != len(lines) {
		t.Fatalf("%d output lines for %d input lines", len(outs), len(lines))
	}
	m := NewModel()
	epoch := time.Unix(0, 0)
	for i, l := range lines {
		where := fmt.Sprintf("line %d: %s\n output %s\n", i+1, encodeLine(l), outs[i])
		var e struct {
			Error *string `json:"error"`
			Reset bool    `json:"reset"`
		}
		if err := json.Unmarshal([]byte(outs[i]), &e); err != nil {
			t.Fatalf("%s%v", where, err)
		}
		if l.Op == "reset" {
			if !e.Reset {
				t.Fatalf("%swant {\"reset\": true}", where)
			}
			m.Reset(l.Request.Key)
			continue
		}
		var err error
		if e.Error != nil {
			err = errors.New(*e.Error)
		}
		op, _ := replay.Op(l.Op)
		rs := l.Requests
		var got []drip.Decision
		allowed := false
		switch {
		case err != nil:
		case rs != nil:
			var mm drip.Multi
			if err := json.Unmarshal([]byte(outs[i]), &mm); err != nil {
				t.Fatalf("%s%v", where, err)
			}
			got, allowed = mm.Decisions, mm.Allowed
		default:
			var d drip.Decision
			if err := json.Unmarshal([]byte(outs[i]), &d); err != nil {
				t.Fatalf("%s%v", where, err)
			}
			got, allowed = []drip.Decision{d}, d.Allowed
		}
		if rs == nil {
			rs = []drip.Request{l.Request}
		}
		if msg := m.step(op, rs, l.Requests != nil, epoch.Add(l.At), got, allowed, err); msg != "" {
			t.Fatalf("%s%s", where, msg)
		}
	}
}
