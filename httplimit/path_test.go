package httplimit_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/testkit/pathtest"
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

// TestExactPaths: exact_paths keeps a path's case and its segments'
// trailing dots and spaces (so /ADMIN/x is not /admin/x, and is not
// limited by its rule), and nothing else: parameters, the method's case
// and the ambiguous paths are read as without it. The path as a key
// folds the same way: by default /Docs and /docs are one bucket.
func TestExactPaths(t *testing.T) {
	const keyed = `{"name": "per-path", "limit_keys": ["path"], "match": {"path": "/docs/*"},
		"algorithm_config": {"rate": 1, "period": "1h", "burst": 1}}`
	for _, exact := range []bool{false, true} {
		src := strings.Replace(pathtest.Rules, `"rules": [`, `"exact_paths": `+strconv.FormatBool(exact)+`, "rules": [`+keyed+`,`, 1)
		e := newEnv(t, nil, parse(t, src))
		addr := e.srv.Listener.Addr().String()
		folded := map[bool]int{false: 429, true: 200}[exact]
		for _, c := range pathtest.Drain {
			pathtest.Send(t, addr, c.Method, c.Target)
		}
		for _, c := range []struct {
			method, target string
			want           int
		}{
			{"GET", "/docs/A", 200},
			{"GET", "/docs/a", folded},
			{"GET", "/DOCS/a", folded},
			{"GET", "/ADMIN/x", folded},
			{"GET", "/admin./x", folded},
			{"GET", "/admin%20/x", folded},
			{"GET", "/admin;v=1/x", 429},
			{"post", "/upload/a", 429},
			{"GET", "/%2561dmin/x", 400},
			{"GET", "/x/...", map[bool]int{false: 400, true: 200}[exact]}, // read as "." or ".." on Windows
		} {
			if resp, body := pathtest.Send(t, addr, c.method, c.target); resp.StatusCode != c.want {
				t.Errorf("exact_paths %v: %s %s: %d %q, want %d", exact, c.method, c.target, resp.StatusCode, body, c.want)
			}
		}
	}
}

// TestPathUnread: with no rule on the path, the path is not read, so no
// path is refused: an app whose IDs hold encoded slashes or percent signs
// keeps working behind rules that do not look at paths.
func TestPathUnread(t *testing.T) {
	e := newEnv(t, nil, parse(t, freeRules))
	for _, target := range []string{"/%2561dmin/x", "/x/..%2Fy", "/a%00"} {
		if resp, body := pathtest.Send(t, e.srv.Listener.Addr().String(), "GET", target, "X-Api-Key", "k"); resp.StatusCode != 200 {
			t.Errorf("GET %s: %d %q, want 200", target, resp.StatusCode, body)
		}
	}
}
