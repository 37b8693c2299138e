package httplimit_test

import (
	"encoding/json"
	"testing"

	"github.com/driplimit/drip/internal/pathtest"
)

// TestPathSpellings: a request that spells a rule's path or method another
// way (path parameters, case, trailing dots, encodings, dot segments) meets
// the rule, or is refused with a 400 when servers would read it
// differently, and never reaches the handler unlimited.
func TestPathSpellings(t *testing.T) {
	e := newEnv(t, nil, parse(t, pathtest.Rules))
	addr := e.srv.Listener.Addr().String()
	for _, c := range append(pathtest.Drain, pathtest.Cases...) {
		resp, body := pathtest.Send(t, addr, c.Method, c.Target)
		if resp.StatusCode != c.Want {
			t.Errorf("%s %s: %d %q, want %d", c.Method, c.Target, resp.StatusCode, body, c.Want)
			continue
		}
		if c.Want != 400 {
			continue
		}
		var p struct {
			Status int    `json:"status"`
			Reason string `json:"reason"`
			Detail string `json:"detail"`
		}
		if err := json.Unmarshal([]byte(body), &p); err != nil || p.Status != 400 || p.Reason != "ambiguous_path" || p.Detail == "" ||
			resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s: 400 with %q (%v): want a problem with the reason ambiguous_path", c.Method, c.Target, body, err)
		}
	}
	if n, want := e.hits.Load(), int64(2+5); n != want {
		t.Errorf("the handler served %d requests, want %d (the drain and the allowed ones)", n, want)
	}
}
