package replay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

func TestParse(t *testing.T) {
	l, err := replay.Parse([]byte(`{"at": "1.5", "op": "peek", "key": "k", "cost": 0, "limit": {"rate": 2, "period": 0.5}}`))
	if err != nil {
		t.Fatal(err)
	}
	if l.At != 1500*time.Millisecond || l.Op != "peek" || l.Request.Cost != 0 || l.Request.Limit.Period != 500*time.Millisecond {
		t.Fatalf("parsed %+v", l)
	}
	l, err = replay.Parse([]byte(`{"key": "k", "limit": {"rate": 2}}`))
	if err != nil || l.Op != "take" || l.Request.Cost != 1 || l.At != 0 {
		t.Fatalf("defaults: %+v %v", l, err)
	}
	for line, want := range map[string]string{
		`{"key": "k"}`:           "missing limit",
		`{"limit": {"rate": 1}}`: "missing key",
		`{"op": "borrow", "key": "k", "limit": {"rate": 1}}`:                 `op "borrow"`,
		`{"at": "soon", "key": "k", "limit": {"rate": 1}}`:                   "at:",
		`{"key": "k", "limit": {"rate": 1}, "extra": 1}`:                     "unknown field",
		`{"key": "k", "requests": [{"key": "a", "limit": {"rate": 1}}]}`:     "instead of key",
		`{"op": "refund", "requests": [{"key": "a", "limit": {"rate": 1}}]}`: "does not take requests",
		`{"requests": [{"key": "a"}]}`:                                       "requests[0]",
		`{} {}`:                                                              "more than one value",
		`{"op": "reset"}`:                                                    "missing key",
	} {
		if _, err := replay.Parse([]byte(line)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want it to mention %q", line, err, want)
		}
	}
}

// TestRunGoesOn checks that a bad line prints an error and the run goes on,
// and that the output does not depend on the prefix.
func TestRunGoesOn(t *testing.T) {
	in := "{\"key\":\"a\",\"limit\":{\"rate\":1}}\nnonsense\n\n{\"key\":\"a\",\"limit\":{\"rate\":1}}\n{\"op\":\"reset\",\"key\":\"a\"}\n"
	outs := map[string]bool{}
	for _, prefix := range []string{"x:", "y:"} {
		s := memstore.New()
		var out bytes.Buffer
		if err := replay.Run(context.Background(), s, prefix, strings.NewReader(in), &out); err != nil {
			t.Fatal(err)
		}
		s.Close()
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 4 || !strings.Contains(lines[1], `"error"`) || !strings.Contains(lines[2], `"allowed":false`) || lines[3] != `{"reset":true}` {
			t.Fatalf("output:\n%s", out.String())
		}
		outs[out.String()] = true
	}
	if len(outs) != 1 {
		t.Fatal("the output depends on the prefix")
	}
}

// TestDecodeFormats: one parser for drip replay, drip simulate and the
// decision API; each refuses the fields of the others as unknown, and
// every error is a *store.InputError (the decision API's 400).
func TestDecodeFormats(t *testing.T) {
	for _, c := range []struct {
		line string
		f    replay.Format
		want string // "" for no error
	}{
		{`{"key": "k", "limit": {"rate": 1}}`, replay.LineFormat, ""},
		{`{"key": "k", "limit": {"rate": 1}}`, replay.BodyFormat, ""},
		{`{"rule": "free", "values": ["a"]}`, replay.BodyFormat, ""},
		{`{"rule": "free", "values": ["a"]}`, replay.LineFormat, `unknown field "rule"`},
		{`{"requests": [{"values": ["a"]}]}`, replay.LineFormat, `unknown field "values"`},
		{`{"at": 1, "key": "k"}`, replay.BodyFormat, `unknown field "at"`},
		{`{"op": "", "key": "k"}`, replay.BodyFormat, `unknown field "op"`},
		{``, replay.BodyFormat, "bad JSON: empty body"},
		{`{} {}`, replay.BodyFormat, "more than one value in the body"},
		{`{} {}`, replay.LineFormat, "more than one value on the line"},
		{`{"at": "soon"}`, replay.LineFormat, "at:"},
		// One reading only: what encoding/json alone would accept quietly.
		{`{"key": "a", "key": "b", "limit": {"rate": 1}}`, replay.BodyFormat, `field "key" given twice`},
		{`{"key": "k", "limit": {"rate": 1, "rate": 2}}`, replay.LineFormat, `field "rate" given twice`},
		{`{"KEY": "k", "limit": {"rate": 1}}`, replay.BodyFormat, `unknown field "KEY"`},
		{`{"key": "k", "limit": {"Rate": 1}}`, replay.BodyFormat, `unknown field "Rate"`},
		{"{\"\\u212aey\": \"k\", \"limit\": {\"rate\": 1}}", replay.BodyFormat, "unknown field \"\u212aey\""},
		{"{\"key\": \"k\xff\", \"limit\": {\"rate\": 1}}", replay.BodyFormat, "not valid UTF-8"},
		{`{"key": "k\ud800", "limit": {"rate": 1}}`, replay.BodyFormat, "lone surrogate"},
		{`{"key": "k\udc00\ud800", "limit": {"rate": 1}}`, replay.BodyFormat, "lone surrogate"},
		{`{"rule": "r", "values": {"User": "a", "User": "b"}}`, replay.BodyFormat, `field "User" given twice`},
		// ... and what it must still accept.
		{`{"key": "k\ud83d\ude00 \\u00e9 \u00e9 �", "limit": {"rate": 1}}`, replay.BodyFormat, ""},
		{`{"rule": "r", "values": {"User-ID": "a", "user-id": "b"}}`, replay.BodyFormat, ""},
		{`{"requests": [{"key": "a", "limit": {"rate": 1}}, {"key": "b", "limit": {"rate": 1}}]}`, replay.LineFormat, ""},
		{`{"key": "k", "limit": {"rate": 1}`, replay.BodyFormat, "bad JSON: unexpected EOF"},
	} {
		_, err := replay.Decode([]byte(c.line), c.f)
		var ie *store.InputError
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s (%s): %v", c.line, c.f.Unit, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s (%s): err = %v, want it to mention %q", c.line, c.f.Unit, err, c.want)
		case err != nil && (!errors.As(err, &ie) || !store.IsInput(err)):
			t.Errorf("%s (%s): %T is not an input error", c.line, c.f.Unit, err)
		}
	}
	// Parse's errors too, down to a multi-take's requests.
	for _, line := range []string{`{"key": "k"}`, `{"requests": []}`, `{"requests": [{"key": "a"}]}`, `{"op": "reset"}`} {
		if _, err := replay.Parse([]byte(line)); !store.IsInput(err) {
			t.Errorf("%s: %v is not an input error", line, err)
		}
	}
	if store.IsInput(errors.New("connection refused")) || !store.IsInput(fmt.Errorf("x: %w", store.ErrInvalidCost)) {
		t.Error("IsInput tells a store's error from bad input wrongly")
	}
}

// multi is a multi-take line of n requests on distinct keys.
func multi(n int) string {
	rs := make([]string, n)
	for i := range rs {
		rs[i] = `{"key": "k` + strconv.Itoa(i) + `", "limit": {"rate": 1}}`
	}
	return `{"requests": [` + strings.Join(rs, ", ") + `]}`
}

// TestMaxRequests: a multi-take of MaxRequests requests runs; one more is
// an error line, and takes nothing.
func TestMaxRequests(t *testing.T) {
	in := multi(replay.MaxRequests+1) + "\n" + multi(replay.MaxRequests) + "\n"
	s := memstore.New()
	defer s.Close()
	var out bytes.Buffer
	if err := replay.Run(context.Background(), s, "p:", strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || lines[0] != `{"error":"101 requests: a multi-take has at most 100"}` || !strings.HasPrefix(lines[1], `{"allowed":true,`) {
		t.Fatalf("output:\n%s", out.String())
	}
}

// TestDecodeDeepNesting: a body nested as deep as the decision API's 256
// KiB allow is refused by depth, before the strict check could walk (and
// hold a stack frame for) each of its levels; what a request may hold
// still passes.
func TestDecodeDeepNesting(t *testing.T) {
	const cap = 256 << 10
	for _, b := range []string{
		strings.Repeat("[", cap),
		strings.Repeat("[", cap/2) + strings.Repeat("]", cap/2),
		`{"rule": "r", "values": ` + strings.Repeat(`{"a": `, cap/6) + `1` + strings.Repeat("}", cap/6) + `}`,
		`{"requests": ` + strings.Repeat(`[{"a": `, cap/8) + `1`,
		strings.Repeat("[", 17),
	} {
		_, err := replay.Decode([]byte(b), replay.BodyFormat)
		if err == nil || !store.IsInput(err) || !strings.Contains(err.Error(), "nested more than") {
			t.Errorf("%.20s... (%d bytes): err = %v, want an input error about nesting", b, len(b), err)
		}
	}
	ok := `{"requests": [{"key": "a", "limit": {"rate": 1}}, {"key": "b", "limit": {"rate": 1}}]}`
	if _, err := replay.Decode([]byte(ok), replay.LineFormat); err != nil {
		t.Errorf("%s: %v", ok, err)
	}
}

// TestDecodeSaysWhatIsWrong: a limit that is not valid is reported as
// such, not as bad JSON, and a value of the wrong type is named by its
// field in the JSON, never by drip's Go types.
func TestDecodeSaysWhatIsWrong(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{`{"key": "k", "limit": {"rate": 1, "period": "0s"}}`, "invalid limit: period must be > 0"},
		{`{"key": "k", "limit": {"algorithm": "concurrency", "max_in_flight": 1e3}}`, `bad JSON: "max_in_flight" must be a whole number in digits (1000, not 1e3 or 1.5), not number 1e3`},
		{`{"key": "k", "limit": {"rate": 1}, "cost": "1"}`, `bad JSON: "cost" must be a number, not string`},
		{`{"key": 1, "limit": {"rate": 1}}`, `bad JSON: "key" must be a string, not number`},
	} {
		_, err := replay.Decode([]byte(c.line), replay.BodyFormat)
		if err == nil || err.Error() != c.want {
			t.Errorf("%s: err = %v, want %q", c.line, err, c.want)
		}
		if !store.IsInput(err) {
			t.Errorf("%s: %v is not an input error", c.line, err)
		}
	}
}

// TestOutputIgnoresEpoch runs one trace with the store's time 0 at
// several wall times: the output is the same, and is the trace's as if it
// began at the Unix epoch. A sliding window's slot of 1s/7 (142,857,143
// ns) divides no whole second, and a calendar day depends on the time of
// day, so both used to follow the wall clock.
func TestOutputIgnoresEpoch(t *testing.T) {
	in := strings.Join([]string{
		`{"at":0,"key":"s","limit":{"algorithm":"sliding_window","rate":2,"period":"1s","slots":7}}`,
		`{"at":0,"key":"s","limit":{"algorithm":"sliding_window","rate":2,"period":"1s","slots":7}}`,
		`{"at":0.1,"key":"s","limit":{"algorithm":"sliding_window","rate":2,"period":"1s","slots":7}}`,
		`{"at":0,"key":"c","limit":{"algorithm":"fixed_window","rate":10,"period":"day","time_zone":"Europe/Berlin"}}`,
		`{"at":0.5,"key":"w","limit":{"algorithm":"fixed_window","rate":1,"period":"0.7s","start":"0.7s"}}`,
	}, "\n")
	// Worked by hand: slot 0 holds the two takes until slot 8 begins, at
	// 8 x 142,857,143 ns; Berlin's first day of 1970 ends at 23:00 UTC
	// (UTC+1); the 0.7 s window on the epoch's grid that holds 0.5 s ends
	// at 0.7 s.
	want := strings.Join([]string{
		`{"allowed":true,"tokens":1,"remaining":1,"limit":2,"retry_after":0,"reset_after":1.142857144}`,
		`{"allowed":true,"tokens":0,"remaining":0,"limit":2,"retry_after":0,"reset_after":1.142857144}`,
		`{"allowed":false,"tokens":0,"remaining":0,"limit":2,"retry_after":1.042857144,"reset_after":1.042857144}`,
		`{"allowed":true,"tokens":9,"remaining":9,"limit":10,"retry_after":0,"reset_after":82800}`,
		`{"allowed":true,"tokens":0,"remaining":0,"limit":1,"retry_after":0,"reset_after":0.2}`,
	}, "\n") + "\n"
	wall := time.Date(2026, 11, 28, 23, 40, 0, 0, time.UTC)
	for _, epoch := range []time.Time{wall, wall.Add(time.Second), wall.Add(3 * time.Second), wall.Add(13*time.Hour + 7*time.Second), wall.Add(123456789)} {
		s := memstore.New()
		var out bytes.Buffer
		if err := replay.RunAt(context.Background(), s, epoch, "p:", strings.NewReader(in), &out); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if out.String() != want {
			t.Errorf("time 0 at %v:\n%s\nwant\n%s", epoch, out.String(), want)
		}
	}
}
