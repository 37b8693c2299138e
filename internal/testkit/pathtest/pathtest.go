// Package pathtest holds the requests that spell a rule's path or method
// another way, for the tests of every HTTP front door (the middleware, the
// gateway, forward auth behind nginx and Caddy): each must meet the rule
// it tries to dodge, or be refused as ambiguous, never pass unlimited.
package pathtest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Rules limit /admin/* and POSTs to /upload/* with one token each, for
// every client together ("global"): after Drain, a request either rule
// applies to is a 429. Proxies on loopback are trusted (forward auth).
const Rules = `{"trusted_proxies": ["127.0.0.1/32"], "rules": [
  {"name": "admin", "limit_keys": ["global"], "match": {"path": "/admin/*"},
   "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}},
  {"name": "uploads", "limit_keys": ["global"], "match": {"path": "/upload/*", "method": "POST"},
   "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}}]}`

// Case is one request and the status it must get once the rules' buckets
// are drained: 429 (a rule applied), 400 (refused as ambiguous) or 200
// (no rule applies: the normal form of the path is elsewhere).
type Case struct {
	Method, Target string
	Want           int
}

// Drain are the requests that take the rules' only tokens.
var Drain = []Case{{"GET", "/admin/x", 200}, {"POST", "/upload/a", 200}}

// Cases are the spellings to try after Drain.
var Cases = []Case{
	{"GET", "/admin/x", 429},
	// Path parameters, stripped per segment as servlet containers do.
	{"GET", "/admin;/x", 429},
	{"GET", "/admin;x=1/y", 429},
	{"GET", "/admin;jsessionid=abc/x", 429},
	{"GET", "/x/..;/admin/x", 429},
	{"GET", "/admin%3Bx/y", 429},
	// The method in another case.
	{"post", "/upload/a", 429},
	{"Post", "/upload/b", 429},
	// Case, and the trailing dots and spaces Windows drops.
	{"GET", "/ADMIN/x", 429},
	{"GET", "/admin%20/x", 429},
	{"GET", "/admin./x", 429},
	{"GET", "/Admin.%20./x", 429},
	// Encodings, duplicate slashes and dot segments.
	{"GET", "/%61dmin/x", 429},
	{"GET", "//admin//x", 429},
	{"GET", "/x/%2e%2e/admin/x", 429},
	// Ambiguous: refused.
	{"GET", "/%2561dmin/x", 400},           // encoded twice
	{"GET", "/admin%00/x", 400},            // NUL
	{"GET", "/admin%0a/x", 400},            // a control character
	{"GET", "/x/..%2Fadmin/x", 400},        // an encoded slash beside ".."
	{"GET", "/admin/x%2F..%2F..%2Fy", 400}, // the same, the other way round
	{"GET", "/x/..%5Cadmin/x", 400},        // a backslash
	{"GET", "/%C0%AE%C0%AE/admin/x", 400},  // not UTF-8 (overlong dots)
	// Not the rules' paths: allowed.
	{"GET", "/public/x", 200},
	{"GET", "/upload/a", 200},
	{"GET", "/administrator", 200},
	{"GET", "/projects/a%2Fb/issues", 200},
	{"GET", "/files/100%25", 200},
}

// Send sends method and target to the HTTP server at addr ("host:port")
// as they are, on a connection of its own (an HTTP client would clean or
// re-encode the target), with the header lines hdr (name, value, ...),
// and returns the response with its body read.
func Send(t *testing.T, addr, method, target string, hdr ...string) (*http.Response, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(addr, "http://"), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", method, target)
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}
