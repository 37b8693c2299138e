package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/driplimit/drip/store/memstore"
)

// TestWindowInputs: a decision API body's calendar and sliding window
// fields are bounded and checked before any store call: a time zone that
// is not a name of the time zone database (path tricks, the machine's own
// zone files, a 10 KB name), a calendar period on another algorithm, slots
// out of 1 to 1000 (an explicit 0 too, as the rules file refuses it) are
// each a 400 that says what is wrong, alone and inside a multi-take, and
// nothing is written.
func TestWindowInputs(t *testing.T) {
	ms := memstore.New()
	srv := start(t, Config{}, ms)
	const zone = "time_zone: must name a time zone of the time zone database"
	for _, tc := range []struct{ limit, want string }{
		{`{"algorithm": "fixed_window", "rate": 5, "period": "month", "time_zone": "./Europe/Berlin"}`, zone},
		{`{"algorithm": "fixed_window", "rate": 5, "period": "month", "time_zone": "Europe//Berlin"}`, zone},
		{`{"algorithm": "fixed_window", "rate": 5, "period": "month", "time_zone": "../../etc/passwd"}`, zone},
		{`{"algorithm": "fixed_window", "rate": 5, "period": "month", "time_zone": "/etc/localtime"}`, zone},
		{`{"algorithm": "fixed_window", "rate": 5, "period": "month", "time_zone": "localtime"}`, zone},
		{`{"algorithm": "fixed_window", "rate": 5, "period": "month", "time_zone": "Local"}`, zone},
		{`{"algorithm": "fixed_window", "rate": 5, "period": "month", "time_zone": "right/UTC"}`, zone},
		{`{"algorithm": "fixed_window", "rate": 5, "period": "month", "time_zone": "` + strings.Repeat("A/", 5000) + `B"}`, zone},
		{`{"algorithm": "fixed_window", "rate": 5, "period": "month", "time_zone": "Mars/Olympus"}`, `unknown time zone \"Mars/Olympus\"`},
		{`{"algorithm": "fixed_window", "rate": 5, "period": "1h", "time_zone": "Europe/Berlin"}`, "time_zone applies to a calendar period only"},
		{`{"algorithm": "token_bucket", "rate": 5, "period": "month"}`, "a calendar period applies to fixed_window only"},
		{`{"algorithm": "sliding_window", "rate": 5, "period": "month"}`, "a calendar period applies to fixed_window only"},
		{`{"algorithm": "fixed_window", "rate": 5, "period": "year"}`, `\"year\" is not a duration`},
		{`{"algorithm": "fixed_window", "rate": 5, "period": "month", "burst": 7}`, "a calendar period takes no period, start, max_reserved or burst"},
		{`{"algorithm": "sliding_window", "rate": 5, "period": "1m", "slots": 0}`, "slots must be from 1 to 1000"},
		{`{"algorithm": "sliding_window", "rate": 5, "period": "1m", "slots": -1}`, "slots must be from 1 to 1000"},
		{`{"algorithm": "sliding_window", "rate": 5, "period": "1m", "slots": 1001}`, "slots must be from 1 to 1000"},
		{`{"algorithm": "sliding_window", "rate": 5, "period": "1m", "slots": 99999999999999999999}`, "must be a whole number"},
		{`{"algorithm": "token_bucket", "rate": 5, "period": "1m", "slots": 10}`, "slots applies to sliding_window only"},
		{`{"algorithm": "sliding_window", "rate": 5, "period": "1ns", "slots": 1000}`, "at least a microsecond long"},
	} {
		for _, body := range []string{
			`{"key": "w", "limit": ` + tc.limit + `}`,
			`{"requests": [{"key": "ok", ` + lim + `}, {"key": "w", "limit": ` + tc.limit + `}]}`,
		} {
			code, resp := post(t, srv.base+"/v1/take", body)
			if code != http.StatusBadRequest || !strings.Contains(resp, tc.want) {
				t.Errorf("%.100s: %d %.200s, want 400 with %q", body, code, resp, tc.want)
			}
		}
	}
	if n := ms.Len(); n != 0 {
		t.Errorf("the refused requests wrote %d buckets", n)
	}
}
