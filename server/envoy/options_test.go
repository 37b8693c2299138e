package envoy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/store/memstore"
)

func TestWildcardMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		yes, no []string
	}{
		{"k_ab*", []string{"k_ab", "k_abc", "k_ab*"}, []string{"k_a", "k_xab", "j_abc"}},
		{"k_a*b", []string{"k_ab", "k_axb", "k_abab", "k_a*b"}, []string{"k_a", "k_ba", "k_abx", "k_b"}},
		// The first and last parts may not overlap.
		{"k_a*a", []string{"k_aa", "k_aba"}, []string{"k_a"}},
		{"k_x*y*z", []string{"k_xyz", "k_x1y2z", "k_xyyz", "k_xzyz"}, []string{"k_xzy", "k_xyz1", "k_yxz", "k_xz"}},
		// The middle parts in order, each after the one before.
		{"k_*aa*aa", []string{"k_aaaa", "k_aaxaa"}, []string{"k_aaa"}},
		{"k_**", []string{"k_", "k_anything"}, []string{"k"}},
		{"k*", []string{"k_", "key_v", "k"}, []string{"_k"}},
		{"*", []string{"", "x_y"}, nil},
	} {
		w := newWildcard(tc.pattern)
		for _, s := range tc.yes {
			if !w.match(s) {
				t.Errorf("%q does not match %q", tc.pattern, s)
			}
		}
		for _, s := range tc.no {
			if w.match(s) {
				t.Errorf("%q matches %q", tc.pattern, s)
			}
		}
	}
}

// TestWildcardPrecedence: the exact value first, then the wildcards of the
// level in file order (across merged files, in load order), then the key
// alone.
func TestWildcardPrecedence(t *testing.T) {
	a := File{Name: "a.yaml", Data: []byte(`
domain: d
descriptors:
  - key: p
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: p
    value: a*z
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: p
    value: ab*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: p
    value: abz
    rate_limit: {unit: second, requests_per_unit: 4}
`)}
	b := File{Name: "b.yaml", Data: []byte(`
domain: d
descriptors:
  - key: p
    value: "*q"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: z*
    rate_limit: {unit: second, requests_per_unit: 6}
`)}
	c, err := ParseWith(Options{MergeDomains: true}, a, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entry string
		rpu   uint32
	}{
		{"p=abz", 4}, {"p=abxz", 2}, {"p=abx", 3}, {"p=axq", 5}, {"p=abq", 3}, {"p=x", 1},
		{"zx=x", 6}, {"z=", 6},
	} {
		l := c.Match("d", entries(tc.entry))
		if l == nil || l.RequestsPerUnit != tc.rpu {
			t.Errorf("%s: %+v, want the limit of %d", tc.entry, l, tc.rpu)
		}
	}
}

func TestOptionsFromEnv(t *testing.T) {
	env := map[string]string{"MERGE_DOMAIN_CONFIG": "true", "SHADOW_MODE": "1", "RUNTIME_IGNOREDOTFILES": "false"}
	o, err := OptionsFromEnv(func(k string) string { return env[k] })
	if err != nil || o != (Options{MergeDomains: true, Shadow: true}) {
		t.Fatalf("%+v %v", o, err)
	}
	if o, err := OptionsFromEnv(func(string) string { return "" }); err != nil || o != (Options{}) {
		t.Fatalf("unset: %+v %v", o, err)
	}
	env["SHADOW_MODE"] = "yes"
	if _, err := OptionsFromEnv(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), `SHADOW_MODE="yes"`) {
		t.Fatalf("err %v", err)
	}

	// The response's settings: quota mode, dynamic metadata, headers.
	env = map[string]string{"QUOTA_MODE": "true", "RESPONSE_DYNAMIC_METADATA": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_REMAINING_HEADER": "X-RateLimit-Remaining"}
	o, err = OptionsFromEnv(func(k string) string { return env[k] })
	if want := (Options{Quota: true, DynamicMetadata: true, Headers: Headers{Mode: HeadersEnvoy, Remaining: "X-RateLimit-Remaining"}}); err != nil || o != want {
		t.Fatalf("%+v %v, want %+v", o, err, want)
	}
	env["LIMIT_RESPONSE_HEADERS_ENABLED"] = "false"
	if o, err := OptionsFromEnv(func(k string) string { return env[k] }); err != nil || o.Headers.Mode != HeadersNone {
		t.Fatalf("LIMIT_RESPONSE_HEADERS_ENABLED=false: %+v %v", o, err)
	}
	for k, v := range map[string]string{"LIMIT_RESET_HEADER": "Rate Limit", "LIMIT_LIMIT_HEADER": "A:B", "QUOTA_MODE": "on", "LIMIT_RESPONSE_HEADERS_ENABLED": "yes"} {
		bad := map[string]string{k: v}
		if _, err := OptionsFromEnv(func(k string) string { return bad[k] }); err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%q: %v", k, v, err)
		}
	}
}

// TestGlobalShadow: SHADOW_MODE puts every configured limit in shadow
// mode, a limit of 0 and limits below other levels included.
func TestGlobalShadow(t *testing.T) {
	f := File{Name: "f.yaml", Data: []byte(`
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 0}
    descriptors:
      - key: b
        shadow_mode: false
        rate_limit: {unit: second, requests_per_unit: 1}
`)}
	for _, global := range []bool{false, true} {
		c, err := ParseWith(Options{Shadow: global}, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range [][]string{{"a=x"}, {"a=x", "b=y"}} {
			if l := c.Match("d", entries(e...)); l.Shadow != global {
				t.Errorf("SHADOW_MODE=%v: %v shadow %v", global, e, l.Shadow)
			}
		}
	}
}

func TestQuotaModeAndMetadata(t *testing.T) {
	c, err := Parse(File{Name: "f.yaml", Data: []byte(`
domain: d
descriptors:
  - key: a
    quota_mode: true
    metadata: &m
      team: growth
      cost: 2.5
      tags: [x, 1, true, null]
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: b
    metadata: {copy: *m}
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: c
    metadata:
    rate_limit: {unit: hour, requests_per_unit: 100}
`)})
	if err != nil {
		t.Fatal(err)
	}
	a := c.Match("d", entries("a=1"))
	if !a.Quota || a.Metadata.AsMap()["team"] != "growth" || a.Metadata.AsMap()["cost"] != 2.5 {
		t.Fatalf("a: quota %v metadata %v", a.Quota, a.Metadata)
	}
	if tags := a.Metadata.AsMap()["tags"].([]any); len(tags) != 4 || tags[0] != "x" || tags[1] != 1.0 || tags[2] != true || tags[3] != nil {
		t.Fatalf("tags %v", tags)
	}
	if b := c.Match("d", entries("b=1")); b.Quota || b.Metadata.AsMap()["copy"].(map[string]any)["team"] != "growth" {
		t.Fatalf("b: %v %v", b.Quota, b.Metadata)
	}
	if c := c.Match("d", entries("c=1")); c.Metadata != nil {
		t.Fatalf("c: %v", c.Metadata)
	}

	// Aliases cannot make metadata grow without end.
	var bomb strings.Builder
	bomb.WriteString("domain: d\ndescriptors:\n  - key: a\n    metadata:\n      l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 8; i++ {
		bomb.WriteString("      l" + string(rune('0'+i)) + ": &l" + string(rune('0'+i)) + " [*l" + string(rune('0'+i-1)))
		for j := 0; j < 9; j++ {
			bomb.WriteString(", *l" + string(rune('0'+i-1)))
		}
		bomb.WriteString("]\n")
	}
	if _, err := Parse(File{Name: "bomb.yaml", Data: []byte(bomb.String())}); err == nil || !strings.Contains(err.Error(), "more than 10000 values") {
		t.Fatalf("alias bomb: %v", err)
	}
	if _, err := Parse(File{Name: "f.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: a\n    metadata: [1]\n")}); err == nil || !strings.Contains(err.Error(), "metadata: must be a mapping") {
		t.Fatalf("list metadata: %v", err)
	}
}

// TestMissingDomain: a file of descriptors without a domain is an
// envoyproxy/ratelimit file, and is told so in its terms.
func TestMissingDomain(t *testing.T) {
	data := []byte("descriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	if !IsConfig(data) {
		t.Fatal("not recognized")
	}
	_, err := Parse(File{Name: "f.yaml", Data: data})
	if err == nil || err.Error() != "envoy ratelimit config: f.yaml: domain: config file cannot have empty domain" {
		t.Fatalf("err %v", err)
	}
}

// TestDotfiles: a directory's dotfiles are loaded, as envoyproxy/ratelimit
// loads them, unless RUNTIME_IGNOREDOTFILES; a dotfile that is not an
// envoy file (an editor's or a tool's) is never read as one.
func TestDotfiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\n")
	write(".b.yaml", "domain: b\n")
	write(".c.yaml", "not: envoy\n")
	c, err := LoadWith(dir, Options{})
	if err != nil || strings.Join(c.Domains(), " ") != "a b" {
		t.Fatalf("domains %v, err %v", c.Domains(), err)
	}
	c, err = LoadWith(dir, Options{IgnoreDotfiles: true})
	if err != nil || strings.Join(c.Domains(), " ") != "a" {
		t.Fatalf("ignoring dotfiles: domains %v, err %v", c.Domains(), err)
	}
	if c, err := Load(dir); err != nil || strings.Join(c.Domains(), " ") != "a" {
		t.Fatalf("Load: domains %v, err %v", c.Domains(), err)
	}
}

func TestRuntimeDir(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, ""},
		{map[string]string{"RUNTIME_APPDIRECTORY": "x"}, ""},
		{map[string]string{"RUNTIME_SUBDIRECTORY": "ratelimit"}, "/srv/runtime_data/current/ratelimit/config"},
		{map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "rl", "RUNTIME_APPDIRECTORY": "limits"}, "/data/rl/limits"},
		{map[string]string{"RUNTIME_ROOT": "/data"}, "/data/config"},
	} {
		if got := RuntimeDir(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.env, got, tc.want)
		}
	}
}

// TestAlgorithmOption: DRIP_ENVOY_ALGORITHM=fixed_window makes every
// limit envoyproxy/ratelimit's epoch-aligned window, unless the limit says
// otherwise.
func TestAlgorithmOption(t *testing.T) {
	o, err := OptionsFromEnv(func(k string) string {
		if k == "DRIP_ENVOY_ALGORITHM" {
			return "fixed_window"
		}
		return ""
	})
	if err != nil || o.Algorithm != drip.FixedWindow {
		t.Fatalf("%+v %v", o, err)
	}
	c, err := ParseWith(o, File{Name: "f.yaml", Data: []byte(`
domain: d
descriptors:
  - {key: a, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: b, rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}}
`)})
	if err != nil {
		t.Fatal(err)
	}
	if l := c.Match("d", entries("a=1")).Limit; l != (drip.Limit{Algorithm: drip.FixedWindow, Rate: 10, Period: time.Hour, Start: time.Hour}) {
		t.Fatalf("a: %+v", l)
	}
	if l := c.Match("d", entries("b=1")).Limit; l != (drip.Limit{Rate: 10, Period: time.Hour}) {
		t.Fatalf("b: %+v", l)
	}
	if _, err := OptionsFromEnv(func(k string) string { return map[string]string{"DRIP_ENVOY_ALGORITHM": "gcra"}[k] }); err == nil {
		t.Fatal("gcra accepted")
	}
}

// TestFixedWindowsAsUpstream: with fixed windows, a limit counts as
// envoyproxy/ratelimit counts it: requests_per_unit in each window of the
// unit, windows on the unit's grid from the Unix epoch, the whole limit
// back when the next window opens.
func TestFixedWindowsAsUpstream(t *testing.T) {
	c, err := ParseWith(Options{Algorithm: drip.FixedWindow}, File{Name: "f.yaml", Data: []byte("domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: minute, requests_per_unit: 2}}\n")})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 1, 10, 0, 58, 0, time.UTC)
	svc := NewService(memstore.New(), c, engine.WithClock(func() time.Time { return now }))
	call := func() (rlsv3.RateLimitResponse_Code, time.Duration) {
		t.Helper()
		resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: entries("a=x")}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode, resp.Statuses[0].DurationUntilReset.AsDuration()
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got, _ := call(); got != want {
			t.Fatalf("10:00:58 call %d: %v, want %v", i+1, got, want)
		}
	}
	now = now.Add(1500 * time.Millisecond) // 10:00:59.5, same window
	if got, wait := call(); got != rlsv3.RateLimitResponse_OVER_LIMIT || wait != 500*time.Millisecond {
		t.Fatalf("10:00:59.5: %v, wait %v, want OVER_LIMIT until the minute", got, wait)
	}
	now = now.Add(500 * time.Millisecond) // 10:01:00, a new window
	for i := 0; i < 2; i++ {
		if got, _ := call(); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("10:01:00 call %d: %v", i+1, got)
		}
	}
}

// TestMiddleWildcardEnforced: a rule with '*' inside its value limits
// the requests it matches (it used to match none, and let them all
// through), and share_threshold puts every matching value in one bucket.
func TestMiddleWildcardEnforced(t *testing.T) {
	c, err := Parse(File{Name: "f.yaml", Data: []byte(`
domain: d
descriptors:
  - {key: route, value: /api/*/orders, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: shared, value: /v*/x, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 1}}
`)})
	if err != nil {
		t.Fatal(err)
	}
	svc := NewService(memstore.New(), c)
	code := func(entry string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: entries(entry)}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	for _, tc := range []struct {
		entry string
		want  rlsv3.RateLimitResponse_Code
	}{
		{"route=/api/v1/orders", rlsv3.RateLimitResponse_OK},
		{"route=/api/v1/orders", rlsv3.RateLimitResponse_OVER_LIMIT},
		{"route=/api/v2/orders", rlsv3.RateLimitResponse_OK}, // its own bucket
		{"route=/api/v2/users", rlsv3.RateLimitResponse_OK},  // no limit
		{"route=/api/v2/users", rlsv3.RateLimitResponse_OK},
		{"shared=/v1/x", rlsv3.RateLimitResponse_OK},
		{"shared=/v2/x", rlsv3.RateLimitResponse_OVER_LIMIT}, // the same bucket
	} {
		if got := code(tc.entry); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.entry, got, tc.want)
		}
	}
}
