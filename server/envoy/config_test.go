package envoy

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

var update = flag.Bool("update", false, "rewrite testdata/bad/*.err from the loader's messages")

// entries builds descriptor entries from "key=value" pairs.
func entries(kvs ...string) []*ratelimitv3.RateLimitDescriptor_Entry {
	out := make([]*ratelimitv3.RateLimitDescriptor_Entry, len(kvs))
	for i, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		out[i] = &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	return out
}

func loadReadme(t *testing.T) *Config {
	t.Helper()
	c, err := Load("testdata/readme")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestLoadReadmeExamples(t *testing.T) {
	c := loadReadme(t)
	want := []string{"demo", "edge_proxy_per_ip", "example4", "example6", "example7", "example8", "example9", "internal", "messaging", "mongo_cps"}
	if got := strings.Join(c.Domains(), " "); got != strings.Join(want, " ") {
		t.Fatalf("domains %q, want %q", got, want)
	}
	if n := len(c.Files()); n != 10 {
		t.Fatalf("%d files loaded, want 10", n)
	}
	for _, f := range c.Files() {
		data, _ := os.ReadFile(f)
		if !IsConfig(data) {
			t.Errorf("%s is not recognized as an envoyproxy/ratelimit file", f)
		}
	}
	if IsConfig([]byte(`{"rules": [{"name": "a"}]}`)) || IsConfig([]byte("rules: []\n")) || IsConfig([]byte("- domain: x")) {
		t.Fatal("drip's rules format taken for envoy's")
	}
}

// TestMatch holds matching to the cases envoyproxy/ratelimit's README
// describes, in configurations of our own (testdata/readme).
func TestMatch(t *testing.T) {
	c := loadReadme(t)
	other, err := Load("testdata/example4-other-depth.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		path string // "" for no limit
		rpu  uint32
	}
	for _, tc := range []struct {
		cfg     *Config
		domain  string
		entries []string
		want    want
	}{
		// Example 1: key and value.
		{c, "mongo_cps", []string{"database=users"}, want{"mongo_cps.database_users", 500}},
		{c, "mongo_cps", []string{"database=default"}, want{"mongo_cps.database_default", 500}},
		{c, "mongo_cps", []string{"database=other"}, want{}},
		// Example 2: nested, key-only wildcard, and a top-level key-only.
		{c, "messaging", []string{"message_type=marketing", "to_number=2061111111"}, want{"messaging.message_type_marketing.to_number", 5}},
		{c, "messaging", []string{"to_number=2061111111"}, want{"messaging.to_number", 100}},
		{c, "messaging", []string{"message_type=marketing"}, want{}},
		{c, "messaging", []string{"message_type=transactional", "to_number=2061111111"}, want{}},
		// Example 3: the most specific match first.
		{c, "edge_proxy_per_ip", []string{"remote_address=50.0.0.1"}, want{"edge_proxy_per_ip.remote_address", 10}},
		{c, "edge_proxy_per_ip", []string{"remote_address=50.0.0.5"}, want{"edge_proxy_per_ip.remote_address_50.0.0.5", 0}},
		// Example 4: depth must match.
		{c, "example4", []string{"key=value", "subkey=subvalue"}, want{"example4.key_value.subkey", 300}},
		{other, "example4", []string{"key=value", "subkey=subvalue"}, want{}},
		{other, "example4", []string{"key=value"}, want{"example4.key_value", 300}},
		// Example 5: unlimited.
		{c, "internal", []string{"ldap=x"}, want{"internal.ldap", 0}},
		{c, "internal", []string{"azure=x"}, want{"internal.azure", 100}},
		// Example 6: shadow mode.
		{c, "example6", []string{"service=auth-service", "user=user-a"}, want{"example6.service.user_user-a", 10}},
		{c, "example6", []string{"service=auth-service", "user=user-b"}, want{"example6.service.user_user-b", 20}},
		{c, "example6", []string{"service=auth-service", "user=user-c"}, want{}},
		// Example 8: a value beats the key alone.
		{c, "example8", []string{"key1=value1"}, want{"example8.key1_value1", 20}},
		{c, "example8", []string{"key1=unspecified"}, want{"example8.key1", 10}},
		// Example 9: wildcard values.
		{c, "example9", []string{"key1=value1"}, want{"example9.key1_value*", 20}},
		{c, "example9", []string{"key1=value"}, want{"example9.key1_value*", 20}},
		{c, "example9", []string{"key1=valu"}, want{}},
		// The demo config: a limit at a level with children.
		{c, "demo", []string{"app=x"}, want{"demo.app", 2}},
		{c, "demo", []string{"app=x", "user=bob"}, want{"demo.app.user", 3}},
		{c, "demo", []string{"app=x", "user=ann"}, want{"demo.app.user_ann", 1}},
		{c, "demo", []string{"app=x", "user=mallory"}, want{"demo.app.user_mallory", 0}},
		{c, "demo", []string{"app=x", "user=bob", "extra=z"}, want{}},
		{c, "demo", []string{"app=x", "path=/beta"}, want{"demo.app.path_/beta", 3}},
		{c, "demo", []string{"app=x", "path=/x"}, want{"demo.app.path", 1}},
		{c, "demo", []string{"from=gateway", "to=search"}, want{"demo.from_gateway.to_search", 1}},
		{c, "demo", []string{"from=gateway"}, want{}},
		{c, "demo", []string{"plan=pro"}, want{"demo.plan_pro", 2}},
		{c, "demo", []string{"plan=team"}, want{}},
		// Unknown domain.
		{c, "nope", []string{"database=users"}, want{}},
		{nil, "mongo_cps", []string{"database=users"}, want{}},
	} {
		l := tc.cfg.Match(tc.domain, entries(tc.entries...))
		name := tc.domain + " " + strings.Join(tc.entries, ",")
		switch {
		case tc.want.path == "" && l != nil:
			t.Errorf("%s: matched %s, want no limit", name, l.Path)
		case tc.want.path != "" && l == nil:
			t.Errorf("%s: no limit, want %s", name, tc.want.path)
		case l != nil && (l.Path != tc.want.path || l.RequestsPerUnit != tc.want.rpu):
			t.Errorf("%s: matched %s %d, want %s %d", name, l.Path, l.RequestsPerUnit, tc.want.path, tc.want.rpu)
		}
	}
}

func TestLimits(t *testing.T) {
	c := loadReadme(t)
	l := c.Match("messaging", entries("to_number=1"))
	if want := (drip.Limit{Rate: 100, Period: 24 * time.Hour}); l.Limit != want {
		t.Fatalf("limit %+v, want %+v", l.Limit, want)
	}
	if p := policyOf(t, c, "messaging", "to_number=1"); p != `"messaging.to_number";q=100;w=86400` {
		t.Fatalf("policy %s", p)
	}
	if l := c.Match("internal", entries("ldap=x")); !l.Unlimited || l.Limit != (drip.Limit{}) {
		t.Fatalf("unlimited: %+v", l)
	}
	if l := c.Match("example6", entries("service=s", "user=user-a")); !l.Shadow {
		t.Fatal("shadow_mode lost")
	}
	if l := c.Match("example7", entries("key_2=value_2", "user=bkthomps")); len(l.Replaces) != 1 || l.Replaces[0] != "specific_limit" {
		t.Fatalf("replaces: %+v", l.Replaces)
	}
	if l := c.Match("demo", entries("tier=partner")); strings.Join(l.Replaces, " ") != "per_user nobody" {
		t.Fatalf("replaces: %+v", l.Replaces)
	}
	if l := c.Match("demo", entries("app=x", "path=/beta")); !l.Shadow || l.Quota {
		t.Fatalf("shadow: %+v", l)
	}
	if l := c.Match("demo", entries("app=x", "internal=y")); !l.Unlimited {
		t.Fatalf("unlimited: %+v", l)
	}
	pro := c.Match("demo", entries("plan=pro"))
	if q := pro.Metadata.AsMap()["quota"].(map[string]any); !pro.Quota || q["plan"] != "pro" || q["seats"] != 5.0 {
		t.Fatalf("quota_mode and metadata: %+v", pro)
	}

	d, err := Load("testdata/drip-fields.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if l, p := d.Match("api", entries("api_key=k")), policyOf(t, d, "api", "api_key=k"); l.Limit != (drip.Limit{Rate: 10, Period: time.Second, Burst: 20}) || p != `"api.api_key";q=20;w=2` {
		t.Fatalf("burst: %+v %s", l.Limit, p)
	}
	if l := d.Match("api", entries("plan=free")); l.Limit != (drip.Limit{Algorithm: drip.FixedWindow, Rate: 60, Period: time.Minute, Start: time.Minute}) {
		t.Fatalf("fixed window: %+v", l.Limit)
	}
	m1, m2 := d.match("api", entries("path=/files/a")), d.match("api", entries("path=/files/b"))
	if m1.limit == nil || bucketKey("api", entries("path=/files/a"), m1.shared) != bucketKey("api", entries("path=/files/b"), m2.shared) {
		t.Fatal("share_threshold: values of one wildcard do not share a bucket")
	}
	if bucketKey("ab", entries("c=d"), nil) == bucketKey("a", entries("bc=d"), nil) || bucketKey("a", entries("b=c_d"), nil) == bucketKey("a", entries("b_c=d"), nil) {
		t.Fatal("keys collide")
	}
}

func TestBadConfigs(t *testing.T) {
	paths, _ := filepath.Glob("testdata/bad/*.yaml")
	if len(paths) == 0 {
		t.Fatal("no fixtures")
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			_, err := Load(p)
			if err == nil {
				t.Fatal("loaded")
			}
			if re := (*rules.Error)(nil); !errors.As(err, &re) {
				t.Fatalf("error %T %v, want *Error", err, err)
			}
			golden := strings.TrimSuffix(p, ".yaml") + ".err"
			if *update {
				os.WriteFile(golden, []byte(err.Error()+"\n"), 0o644)
				return
			}
			want, rerr := os.ReadFile(golden)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if got := err.Error() + "\n"; got != string(want) {
				t.Fatalf("error:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func TestDuplicateDomain(t *testing.T) {
	a := File{Name: "a.yaml", Data: []byte("domain: d\ndescriptors: []\n")}
	b := File{Name: "b.yaml", Data: []byte("domain: d\n")}
	_, err := Parse(a, b)
	if err == nil || err.Error() != `envoy ratelimit config: b.yaml: domain: duplicate domain "d" (also in a.yaml)` {
		t.Fatalf("err %v", err)
	}
}

func FuzzParse(f *testing.F) {
	paths, _ := filepath.Glob("testdata/*/*.yaml")
	for _, p := range paths {
		b, _ := os.ReadFile(p)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseWith(Options{MergeDomains: true}, File{Name: "f.yaml", Data: data}, File{Name: "g.yaml", Data: data})
		if err != nil {
			if re := (*rules.Error)(nil); !errors.As(err, &re) {
				t.Fatalf("error %T", err)
			}
			return
		}
		for _, d := range c.Domains() {
			c.Match(d, entries("a=b", "c=d"))
			c.Match(d, entries("a=x*y", "a=", "key=value*z"))
		}
	})
}

// policyOf is the RateLimit-Policy header of a request of one descriptor
// (entries "key=value") under c, on a memory store.
func policyOf(t *testing.T, c *Config, domain string, kvs ...string) string {
	t.Helper()
	ms := memstore.New()
	defer ms.Close()
	resp, err := NewService(ms, c).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(kvs...)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == "RateLimit-Policy" {
			return h.Value
		}
	}
	return ""
}
