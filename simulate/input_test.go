package simulate

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
)

func TestReadTrace(t *testing.T) {
	in := `{"at": 0, "key": "a", "limit": {"rate": 1, "burst": 2}}
{"at": "0.5", "key": "a", "cost": 2, "limit": {"rate": 1, "burst": 2}}

{"at": 1.5, "op": "refund", "key": "a", "cost": 1, "limit": {"rate": 1, "burst": 2}}
{"at": 2, "op": "reset", "key": "a"}
{"at": 2.25, "key": "b", "reserve": true}
`
	evs, err := ReadTrace(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 5 {
		t.Fatalf("%d events, want 5", len(evs))
	}
	if e := evs[1]; e.At != 500*time.Millisecond || e.Cost != 2 || e.Op != Take || e.Limit == nil || e.Limit.Burst != 2 {
		t.Errorf("line 2: %+v", e)
	}
	if evs[2].Op != Refund || evs[3].Op != Reset || evs[4].Limit != nil || !evs[4].Reserve || evs[4].Cost != 1 {
		t.Errorf("lines 4-6: %+v", evs[2:])
	}
	// Line 6 has no limit: the run's applies. a: 2 tokens, takes 1 at 0,
	// then 2 at 0.5 finds 1.5: denied.
	res, err := Run(context.Background(), evs, Options{Limit: drip.PerSecond(100)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Total.Sent != 3 || res.Total.Accepted != 2 || res.FirstDenial == nil || res.FirstDenial.N != 2 {
		t.Errorf("total %+v, first denial %+v; want the second take denied", res.Total, res.FirstDenial)
	}

	for _, c := range []struct{ in, want string }{
		{`{"at": 0, "key": "a"}` + "\n" + `{"at": 0, "kee": "a"}`, `line 2: bad JSON: json: unknown field "kee"`},
		{`{"at": 0, "op": "poke", "key": "a"}`, `line 1: op "poke"`},
		{`{"at": 0}`, "line 1: missing key"},
		{`{"at": "soon", "key": "a"}`, "line 1: at:"},
		{`{"requests": [{"key": "a"}]}`, "line 1: multi-takes"},
	} {
		if _, err := ReadTrace(strings.NewReader(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.in, err, c.want)
		}
	}
}

func TestReadLog(t *testing.T) {
	in := `10.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 2326 "-" "curl"
10.0.0.2 - - [10/Oct/2000:13:55:37 -0700] "GET /a HTTP/1.1" 200 2326 "-" "curl"
# a comment without a time
10.0.0.1 - - [10/Oct/2000:13:55:38.5 -0700] "GET / HTTP/1.1" 429 0 "-" "curl"
`
	evs, st, err := ReadLog(strings.NewReader(in), LogOptions{KeyField: 1})
	if err != nil {
		t.Fatal(err)
	}
	if st.Lines != 4 || st.Skipped != 1 || st.NoKey != 0 || !st.Start.Equal(time.Date(2000, 10, 10, 20, 55, 36, 0, time.UTC)) {
		t.Errorf("stats %+v", st)
	}
	want := []Arrival{{At: 0, Key: "10.0.0.1", Cost: 1}, {At: time.Second, Key: "10.0.0.2", Cost: 1}, {At: 2500 * time.Millisecond, Key: "10.0.0.1", Cost: 1}}
	if len(evs) != len(want) {
		t.Fatalf("events %+v, want %+v", evs, want)
	}
	for i := range want {
		if evs[i] != want[i] {
			t.Errorf("event %d: %+v, want %+v", i, evs[i], want[i])
		}
	}

	// RFC 3339 in several spellings, out of order; keys by regexp; one
	// line without a key shares the bucket "-".
	in = `{"time":"2024-05-01T12:00:01.5Z","user":"ann"}
{"time":"2024-05-01T12:00:00Z","user":"bob"}
2024-05-01 14:00:02+02:00 user=ann
2024-05-01T12:00:03 anonymous
2024-05-01T14:00:04.25+0200 user=bob
`
	evs, st, err = ReadLog(strings.NewReader(in), LogOptions{KeyPattern: regexp.MustCompile(`user"?[:=]"?(\w+)`), Cost: 2})
	if err != nil {
		t.Fatal(err)
	}
	if st.Skipped != 0 || st.NoKey != 1 {
		t.Errorf("stats %+v", st)
	}
	wantAt := []time.Duration{1500 * time.Millisecond, 0, 2 * time.Second, 3 * time.Second, 4250 * time.Millisecond}
	wantKey := []string{"ann", "bob", "ann", "-", "bob"}
	for i, e := range evs {
		if e.At != wantAt[i] || e.Key != wantKey[i] || e.Cost != 2 {
			t.Errorf("line %d: %+v, want at %v key %s cost 2", i+1, e, wantAt[i], wantKey[i])
		}
	}

	if _, _, err := ReadLog(strings.NewReader("no time here\n"), LogOptions{}); err == nil {
		t.Error("a log without timestamps: no error")
	}
}
