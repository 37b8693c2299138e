package replay_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/replay"
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
