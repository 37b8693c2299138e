package server

import (
	"path/filepath"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/driplimit/drip/server/envoy"
	"github.com/driplimit/drip/store/memstore"
)

const edgeRequest = `{"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "192.0.2.1"}]}]}`

// TestEnvoyHTTP: envoyproxy/ratelimit's /json and /healthcheck on the
// admin listener, without a gRPC listener.
func TestEnvoyHTTP(t *testing.T) {
	dir := t.TempDir()
	edge := filepath.Join(dir, "edge.yaml")
	envoyFile(t, edge, 2)
	srv := start(t, Config{Rules: dir, WatchEvery: -1}, memstore.New())

	if code, out := call(t, "GET", srv.admin+"/healthcheck", ""); code != 200 || out != "OK\n" {
		t.Fatalf("/healthcheck: %d %q", code, out)
	}
	for i, want := range []int{200, 200, 429} {
		code, out := post(t, srv.admin+"/json", edgeRequest)
		if code != want {
			t.Fatalf("call %d: %d %s, want %d", i+1, code, out, want)
		}
		wantCode := `"overallCode":"OK"`
		if want == 429 {
			wantCode = `"overallCode":"OVER_LIMIT"`
		}
		if out = strings.ReplaceAll(out, " ", ""); !strings.Contains(out, wantCode) || !strings.Contains(out, `"requestsPerUnit":2`) {
			t.Fatalf("call %d: %s", i+1, out)
		}
	}
	// Reloads reach /json (for a new client: buckets keep their state).
	envoyFile(t, edge, 50)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if code, out := post(t, srv.admin+"/json", strings.Replace(edgeRequest, "192.0.2.1", "192.0.2.2", 1)); code != 200 || !strings.Contains(out, `"requestsPerUnit":50`) {
		t.Fatalf("after reload: %d %s", code, out)
	}

	for _, tc := range []struct {
		body string
		code int
		want string
	}{
		{`{"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address"}]}], "bogus": 1}`, 400, "not a RateLimitRequest"},
		{`{"domain": "", "descriptors": [{"entries": [{"key": "k"}]}]}`, 400, "domain must not be empty"},
		{`{"domain": "edge", "descriptors": [` + strings.Repeat(`{"entries": [{"key": "k"}]},`, 60000) + `{}]}`, 413, "over 1 MiB"},
		// Refused before protojson decodes them (envoy.JSONBounds: the
		// gRPC codec's bound), not decoded to some 25 times their size;
		// protojson reads an escaped key as the name, and so does the count.
		{`{"domain": "edge", "descriptors": [` + strings.Repeat(`{},`, 300000) + `{}]}`, 400, "300001 descriptors with 0 entries: at most 64 descriptors of at most 32 entries each"},
		{`{"domain": "edge", "descriptors": [{"entries": [` + strings.Repeat(`{},`, 200000) + `{}]}]}`, 400, "1 descriptors with 200001 entries"},
		{`{"domain": "edge", "descr\u0069ptors": [` + strings.Repeat(`{},{"entries":null},`, 20000) + `{}]}`, 400, "40001 descriptors with 0 entries"},
		{`{"domain": "edge", "descriptors": [` + strings.Repeat(`{"entries": [{"key": "k", "value": "v"}]},`, 65) + `{}]}`, 400, "66 descriptors: at most 64 per request"},
	} {
		if code, out := post(t, srv.admin+"/json", tc.body); code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("%.40s: %d %s, want %d %q", tc.body, code, out, tc.code, tc.want)
		}
	}
	if code, _ := call(t, "GET", srv.admin+"/json", ""); code != 405 {
		t.Fatalf("GET /json: %d", code)
	}
}

func TestEnvoyHTTPStoreDown(t *testing.T) {
	dir := t.TempDir()
	envoyFile(t, filepath.Join(dir, "edge.yaml"), 2)
	srv := start(t, Config{Rules: dir, WatchEvery: -1}, failing{})
	if code, _ := call(t, "GET", srv.admin+"/healthcheck", ""); code != 500 {
		t.Fatalf("/healthcheck with the store down: %d", code)
	}
	if code, out := post(t, srv.admin+"/json", edgeRequest); code != 503 || !strings.Contains(out, "connection refused") {
		t.Fatalf("/json with the store down: %d %s", code, out)
	}
}

// TestEnvoyOptions: envoyproxy/ratelimit's loading settings at the rules
// path: dotfiles, merged domains, a file without a domain, global shadow
// mode.
func TestEnvoyOptions(t *testing.T) {
	dir := t.TempDir()
	rulesFile(t, filepath.Join(dir, "rules.json"), 3, "api")
	envoyFile(t, filepath.Join(dir, "edge.yaml"), 1)
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), "domain: hidden\n")
	writeFile(t, filepath.Join(dir, ".tool.yaml"), "something: else\n") // not a second drip rules file
	srv := start(t, Config{Rules: dir, WatchEvery: -1}, memstore.New())
	if got := strings.Join(srv.rs.envoy.Domains(), " "); got != "edge hidden" {
		t.Fatalf("domains %q", got)
	}
	srv = start(t, Config{Rules: dir, WatchEvery: -1, Envoy: envoy.Options{IgnoreDotfiles: true}}, memstore.New())
	if got := strings.Join(srv.rs.envoy.Domains(), " "); got != "edge" {
		t.Fatalf("ignoring dotfiles: domains %q", got)
	}

	// SHADOW_MODE: over the limit, yet OK.
	srv = start(t, Config{Rules: dir, WatchEvery: -1, Envoy: envoy.Options{Shadow: true}}, memstore.New())
	for i := 0; i < 3; i++ {
		if code, out := post(t, srv.admin+"/json", edgeRequest); code != 200 {
			t.Fatalf("shadow call %d: %d %s", i+1, code, out)
		}
	}

	// Two files of one domain: merged with MERGE_DOMAIN_CONFIG only.
	writeFile(t, filepath.Join(dir, "edge2.yaml"), "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	if _, err := New(Config{Rules: dir}, memstore.New()); err == nil || !strings.Contains(err.Error(), `duplicate domain "edge"`) {
		t.Fatalf("without merging: %v", err)
	}
	srv = start(t, Config{Rules: dir, WatchEvery: -1, Envoy: envoy.Options{MergeDomains: true}}, memstore.New())
	for key, rpu := range map[string]uint32{"remote_address": 1, "user": 1} {
		l := srv.rs.envoy.Match("edge", []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: "v"}})
		if l == nil || l.RequestsPerUnit != rpu {
			t.Fatalf("merged domain: %s: %+v", key, l)
		}
	}

	// A directory of other dotfiles only holds no rules.
	dots := t.TempDir()
	writeFile(t, filepath.Join(dots, ".tool.yaml"), "something: else\n")
	if _, err := New(Config{Rules: dots}, memstore.New()); err == nil || !strings.Contains(err.Error(), "no *.yaml") {
		t.Fatalf("dotfiles only: %v", err)
	}

	// A file of descriptors without a domain is told so in envoy's terms.
	bad := t.TempDir()
	writeFile(t, filepath.Join(bad, "edge.yaml"), "descriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	if _, err := New(Config{Rules: bad}, memstore.New()); err == nil || !strings.Contains(err.Error(), "config file cannot have empty domain") {
		t.Fatalf("no domain: %v", err)
	}
}
