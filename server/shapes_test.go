package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/simulate"
	"github.com/driplimit/drip/store/memstore"
)

// limitShapes are the inline limits the decision API takes, one of each
// shape: token buckets (continuous, interval, with a reservation bound),
// fixed windows (keyed by a hash of the key, with a start, aligned with
// the epoch, calendar days, weeks and months in a time zone), sliding
// windows (slots that divide a second, that do not, one slot).
// reserve marks those whose takes reserve.
var limitShapes = []struct {
	limit   string
	reserve bool
}{
	{limit: `{"rate": 10}`},
	{limit: `{"algorithm": "token_bucket", "rate": 5, "period": "10s", "burst": 20}`},
	{limit: `{"rate": 5, "period": 2.5, "burst": 8, "refill": "interval"}`},
	{limit: `{"rate": 2, "burst": 3, "max_reserved": 4}`, reserve: true},
	{limit: `{"algorithm": "fixed_window", "rate": 3, "period": "1m"}`},
	{limit: `{"algorithm": "fixed_window", "rate": 3, "period": "0.7s", "start": "0.2s"}`},
	{limit: `{"algorithm": "fixed_window", "rate": 3, "period": "1h", "start": 0}`},
	{limit: `{"algorithm": "fixed_window", "rate": 4, "period": "1m", "max_reserved": 2}`, reserve: true},
	{limit: `{"algorithm": "fixed_window", "rate": 10, "period": "day", "time_zone": "Europe/Berlin"}`},
	{limit: `{"algorithm": "fixed_window", "rate": 3, "period": "week"}`},
	{limit: `{"algorithm": "fixed_window", "rate": 3, "period": "month", "time_zone": "America/New_York", "burst": 3}`},
	{limit: `{"algorithm": "sliding_window", "rate": 3, "period": "1s"}`},
	{limit: `{"algorithm": "sliding_window", "rate": 2, "period": "1s", "slots": 7}`},
	{limit: `{"algorithm": "sliding_window", "rate": 2.5, "period": "700ms", "slots": 1}`},
}

// TestLimitShapesEverywhere runs every shape of limit through the decision
// API, drip replay and drip simulate. The decision API takes each and
// answers its first take as replay does (the time of day aside: it
// decides on its own clock); replay and simulate answer a whole trace the
// same, line for line, both as if the trace began at the Unix epoch.
func TestLimitShapesEverywhere(t *testing.T) {
	srv := start(t, Config{}, memstore.New(memstore.WithClock(testclock.New().Now)))
	ats := []float64{0, 0, 0.1, 0.25, 0.9, 1.3, 30, 61.5, 3599, 86399.5, 86400.2, 7*86400 + 3, 40 * 86400}
	for i, sh := range limitShapes {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			var in strings.Builder
			for j, at := range ats {
				key := []string{"a", "b"}[j%2]
				fmt.Fprintf(&in, `{"at": %g, "key": %q, "limit": %s, "reserve": %v}`+"\n", at, key, sh.limit, sh.reserve)
			}

			// drip replay, at a wall time of its own.
			ms := memstore.New()
			defer ms.Close()
			var out bytes.Buffer
			if err := replay.RunAt(context.Background(), ms, time.Date(2026, 11, 29, 0, 13, 7, 0, time.UTC), "r:", strings.NewReader(in.String()), &out); err != nil {
				t.Fatal(err)
			}
			got := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(got) != len(ats) {
				t.Fatalf("replay answered %d lines for %d", len(got), len(ats))
			}
			for j, line := range got {
				if strings.Contains(line, `"error"`) {
					t.Fatalf("replay line %d of %s: %s", j, sh.limit, line)
				}
			}

			// drip simulate, on the same trace.
			evs, err := simulate.ReadTrace(strings.NewReader(in.String()))
			if err != nil {
				t.Fatalf("simulate reads %s: %v", sh.limit, err)
			}
			res, err := simulate.Run(context.Background(), evs, simulate.Options{Keep: len(evs)})
			if err != nil {
				t.Fatalf("simulate runs %s: %v", sh.limit, err)
			}
			for j, o := range res.First {
				b, err := json.Marshal(o.Decision)
				if err != nil {
					t.Fatal(err)
				}
				if string(b) != got[j] {
					t.Errorf("%s at %gs: simulate %s, replay %s", sh.limit, ats[j], b, got[j])
				}
			}

			// The decision API: its first take of a fresh key.
			code, body := post(t, srv.base+"/v1/take", fmt.Sprintf(`{"key": "shape%d", "limit": %s, "reserve": %v}`, i, sh.limit, sh.reserve))
			if code != http.StatusOK {
				t.Fatalf("decision API refuses %s: %d %s", sh.limit, code, body)
			}
			api, first := decision(t, body), decision(t, got[0])
			if api.Allowed != first.Allowed || api.Tokens != first.Tokens || api.Remaining != first.Remaining || api.Burst != first.Burst {
				t.Errorf("%s: decision API %+v, replay %+v", sh.limit, api, first)
			}
		})
	}

	// A concurrency limit: the decision API and replay take it; simulate
	// refuses it by name (simulated requests have no duration).
	lim := `{"algorithm": "concurrency", "max_in_flight": 2}`
	if code, body := post(t, srv.base+"/v1/acquire", `{"key": "inflight", "limit": `+lim+`}`); code != http.StatusOK || !decision(t, body).Allowed {
		t.Fatalf("decision API acquire: %d %s", code, body)
	}
	var out bytes.Buffer
	line := `{"key": "inflight", "lease": "l1", "limit": ` + lim + `}`
	if err := replay.RunAt(context.Background(), memstore.New(memstore.WithSweep(0)), time.Now(), "r:", strings.NewReader(line), &out); err != nil || !strings.Contains(out.String(), `"allowed":true`) {
		t.Fatalf("replay acquire: %s %v", out.String(), err)
	}
	evs, err := simulate.ReadTrace(strings.NewReader(line))
	if err == nil {
		_, err = simulate.Run(context.Background(), evs, simulate.Options{})
	}
	if !errors.Is(err, simulate.ErrConcurrency) {
		t.Fatalf("simulate of a concurrency limit: %v, want ErrConcurrency", err)
	}
}
