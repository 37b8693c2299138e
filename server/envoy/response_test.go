package envoy

import (
	"strconv"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/store/memstore"
)

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// codes are a response's overall code and its statuses' codes.
func codesOf(resp *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
	c := []rlsv3.RateLimitResponse_Code{resp.OverallCode}
	for _, s := range resp.Statuses {
		c = append(c, s.Code)
	}
	return c
}

func wantCodes(t *testing.T, what string, resp *rlsv3.RateLimitResponse, want ...rlsv3.RateLimitResponse_Code) {
	t.Helper()
	got := codesOf(resp)
	if len(got) != len(want) {
		t.Fatalf("%s: codes %v, want %v", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: codes (overall, then each descriptor) %v, want %v", what, got, want)
		}
	}
}

// TestQuotaMode: a descriptor in quota_mode over its limit does not deny
// the request by itself, as in envoyproxy/ratelimit: the request is over
// the limit when a descriptor outside quota mode is, or when every quota
// descriptor is (a quota limit in shadow mode never is); the quota
// descriptor's status still says OVER_LIMIT. And, as everywhere in drip,
// what is over its limit, and every descriptor of a denied request, takes
// nothing. On every store.
func TestQuotaMode(t *testing.T) {
	c, err := Parse(File{Name: "q.yaml", Data: []byte(`domain: q
descriptors:
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: quota1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: soft
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: zero
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range stores {
		t.Run(st.Name, func(t *testing.T) {
			r := serve(t, st.Open(t), c, false)

			// Only some quota descriptors over: OK; all of them: OVER_LIMIT.
			resp := r.call(t, "q", 0, desc("quota1=a"), desc("quota2=a"))
			wantCodes(t, "first call", resp, ok, ok, ok)
			resp = r.call(t, "q", 0, desc("quota1=a"), desc("quota2=a"))
			wantCodes(t, "quota1 over, quota2 within", resp, ok, over, ok)
			if s := resp.Statuses[0]; s.LimitRemaining != 0 || s.CurrentLimit.GetRequestsPerUnit() != 1 || s.DurationUntilReset == nil {
				t.Fatalf("quota1's status: %v", s)
			}
			if got := resp.Statuses[1].LimitRemaining; got != 1 {
				t.Fatalf("quota2: remaining %d, want 1 (taken by both calls)", got)
			}
			resp = r.call(t, "q", 0, desc("quota1=a"), desc("quota2=a"))
			wantCodes(t, "third call", resp, ok, over, ok)
			resp = r.call(t, "q", 0, desc("quota1=a"), desc("quota2=a"))
			wantCodes(t, "every quota over", resp, over, over, over)

			// A descriptor outside quota mode over its limit denies, whatever
			// the quota descriptors say; the quota descriptor is not charged.
			for range 2 {
				wantCodes(t, "regular within", r.call(t, "q", 0, desc("regular=r"), desc("quota2=b")), ok, ok, ok)
			}
			resp = r.call(t, "q", 0, desc("regular=r"), desc("quota2=b"))
			wantCodes(t, "regular over", resp, over, over, ok)
			if got := resp.Statuses[1].LimitRemaining; got != 1 {
				t.Fatalf("quota2=b of a denied request: remaining %d, want 1 (untouched)", got)
			}
			resp = r.call(t, "q", 0, desc("quota2=b"))
			wantCodes(t, "quota2=b alone", resp, ok, ok)
			if got := resp.Statuses[0].LimitRemaining; got != 0 {
				t.Fatalf("quota2=b: remaining %d, want 0: the denied request took nothing", got)
			}

			// The only quota descriptor over: the request is over the limit,
			// and the descriptor within its limit is not charged.
			wantCodes(t, "both within", r.call(t, "q", 0, desc("regular=s"), desc("quota1=c")), ok, ok, ok)
			resp = r.call(t, "q", 0, desc("regular=s"), desc("quota1=c"))
			wantCodes(t, "the only quota over", resp, over, ok, over)
			resp = r.call(t, "q", 0, desc("regular=s"))
			if resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 0 {
				t.Fatalf("regular=s after a denial: %v, want OK with 0 left (one taken before, none by the denial)", resp)
			}

			// A quota limit in shadow mode is never over: it lets the request
			// through when the other quota descriptors are over.
			resp = r.call(t, "q", 0, desc("quota1=d"), desc("soft=x"))
			wantCodes(t, "shadow quota, first", resp, ok, ok, ok)
			resp = r.call(t, "q", 0, desc("quota1=d"), desc("soft=x"))
			wantCodes(t, "shadow quota beside a quota over", resp, ok, over, ok)

			// A quota limit of 0 is always over, and alone denies.
			resp = r.call(t, "q", 0, desc("zero=z"), desc("quota2=e"))
			wantCodes(t, "a quota of 0 beside a quota within", resp, ok, over, ok)
			resp = r.call(t, "q", 0, desc("zero=z"))
			wantCodes(t, "a quota of 0 alone", resp, over, over)
		})
	}
}

// TestGlobalQuotaMode: QUOTA_MODE (Options.Quota) puts every limit in
// quota mode, a request's own limit included.
func TestGlobalQuotaMode(t *testing.T) {
	c, err := ParseWith(Options{Quota: true}, File{Name: "g.yaml", Data: []byte(`domain: g
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 5}
`)})
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, memstore.New(), c, false)
	wantCodes(t, "first", r.call(t, "g", 0, desc("a=x"), desc("b=x")), ok, ok, ok)
	wantCodes(t, "a over, b within", r.call(t, "g", 0, desc("a=x"), desc("b=x")), ok, over, ok)
	wantCodes(t, "a alone", r.call(t, "g", 0, desc("a=x")), over, over)
	own := &ratelimitv3.RateLimitDescriptor{
		Entries: entries("own=1"),
		Limit:   &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE},
	}
	wantCodes(t, "own limit, first", r.call(t, "g", 0, desc("a=x"), own), ok, over, ok)
	wantCodes(t, "own limit over, a over", r.call(t, "g", 0, desc("a=x"), own), over, over, over)
	wantCodes(t, "own limit over, b within", r.call(t, "g", 0, own, desc("b=x")), ok, over, ok)

	// Without the option the same file denies as soon as one is over.
	plain, err := Parse(File{Name: "g.yaml", Data: []byte("domain: g\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")})
	if err != nil {
		t.Fatal(err)
	}
	r = serve(t, memstore.New(), plain, false)
	wantCodes(t, "plain, first", r.call(t, "g", 0, desc("a=x"), desc("b=x")), ok, ok, ok)
	wantCodes(t, "plain, a over", r.call(t, "g", 0, desc("a=x"), desc("b=x")), over, over, ok)
}

// TestEnvoyHeaders: LIMIT_RESPONSE_HEADERS_ENABLED=true (HeadersEnvoy)
// sends envoyproxy/ratelimit's three headers, under the names of
// LIMIT_*_HEADER, of one descriptor: the last one over its limit outside
// quota mode, else the first with the fewest requests remaining. With
// fixed windows the reset is the time to the window's end, as there.
func TestEnvoyHeaders(t *testing.T) {
	opts := Options{
		Algorithm: "fixed_window",
		Headers:   Headers{Mode: HeadersEnvoy, Limit: "A-Ratelimit-Limit", Remaining: "A-Ratelimit-Remaining", Reset: "A-Ratelimit-Reset"},
	}
	c, err := ParseWith(opts, File{Name: "h.yaml", Data: []byte(`domain: h
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: e
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: q
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
`)})
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, memstore.New(), c, false)
	r.clock.Add(2e9) // 00:00:02: 58 s left in the minute, 3598 in the hour
	for _, tc := range []struct {
		what string
		ds   []*ratelimitv3.RateLimitDescriptor
		want string
	}{
		{"the fewest remaining", []*ratelimitv3.RateLimitDescriptor{desc("b=1"), desc("a=1"), desc("none=1"), desc("free=1")},
			"A-Ratelimit-Limit: 2\nA-Ratelimit-Remaining: 1\nA-Ratelimit-Reset: 58\n"},
		{"ties: the first", []*ratelimitv3.RateLimitDescriptor{desc("c=1"), desc("e=1")},
			"A-Ratelimit-Limit: 3\nA-Ratelimit-Remaining: 2\nA-Ratelimit-Reset: 3598\n"},
		{"over: a", []*ratelimitv3.RateLimitDescriptor{desc("a=1"), desc("b=1")},
			"A-Ratelimit-Limit: 2\nA-Ratelimit-Remaining: 0\nA-Ratelimit-Reset: 58\n"},
		{"the hour's limit", []*ratelimitv3.RateLimitDescriptor{desc("c=1")},
			"A-Ratelimit-Limit: 3\nA-Ratelimit-Remaining: 1\nA-Ratelimit-Reset: 3598\n"},
		{"the hour's limit", []*ratelimitv3.RateLimitDescriptor{desc("c=1")},
			"A-Ratelimit-Limit: 3\nA-Ratelimit-Remaining: 0\nA-Ratelimit-Reset: 3598\n"},
		{"two over: the last", []*ratelimitv3.RateLimitDescriptor{desc("a=1"), desc("c=1"), desc("b=1")},
			"A-Ratelimit-Limit: 3\nA-Ratelimit-Remaining: 0\nA-Ratelimit-Reset: 3598\n"},
		{"quota within", []*ratelimitv3.RateLimitDescriptor{desc("b=2"), desc("q=1")},
			"A-Ratelimit-Limit: 1\nA-Ratelimit-Remaining: 0\nA-Ratelimit-Reset: 58\n"},
		{"a quota over is not picked before one outside quota mode", []*ratelimitv3.RateLimitDescriptor{desc("q=1"), desc("a=1")},
			"A-Ratelimit-Limit: 2\nA-Ratelimit-Remaining: 0\nA-Ratelimit-Reset: 58\n"},
		{"no limit: no header", []*ratelimitv3.RateLimitDescriptor{desc("none=1"), desc("free=1")}, ""},
	} {
		if got := hdrs(r.call(t, "h", 0, tc.ds...).ResponseHeadersToAdd); got != tc.want {
			t.Errorf("%s: headers\n%s\nwant\n%s", tc.what, got, tc.want)
		}
	}

	// Default names; and none at all with LIMIT_RESPONSE_HEADERS_ENABLED=false.
	for _, h := range []Headers{{Mode: HeadersEnvoy}, {Mode: HeadersNone}} {
		c, err := ParseWith(Options{Headers: h}, File{Name: "d.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4}\n")})
		if err != nil {
			t.Fatal(err)
		}
		r := serve(t, memstore.New(), c, false)
		want := "RateLimit-Limit: 4\nRateLimit-Remaining: 3\nRateLimit-Reset: 1\n"
		if h.Mode == HeadersNone {
			want = ""
		}
		if got := hdrs(r.call(t, "d", 0, desc("a=1")).ResponseHeadersToAdd); got != want {
			t.Errorf("%s: headers\n%s\nwant\n%s", h.Mode, got, want)
		}
	}
}

// TestDynamicMetadata: RESPONSE_DYNAMIC_METADATA (Options.DynamicMetadata)
// returns envoyproxy/ratelimit's dynamic metadata: the domain, the
// descriptors, the hits, and the metadata of the limits of the
// descriptors not over their limit, merged (the first value of a key wins,
// mappings merge).
func TestDynamicMetadata(t *testing.T) {
	file := File{Name: "m.yaml", Data: []byte(`domain: m
descriptors:
  - key: regular
    metadata: {name: service_1, nested: {a: 1}}
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: quota
    quota_mode: true
    metadata: {name: service_2, other: x, nested: {a: 2, b: 3}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    metadata: {free: true}
    rate_limit: {unlimited: true}
`)}
	c, err := ParseWith(Options{DynamicMetadata: true}, file)
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, memstore.New(), c, false)
	md := func(resp *rlsv3.RateLimitResponse) string {
		t.Helper()
		b, err := protojson.Marshal(resp.DynamicMetadata)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	canon := func(s string) string {
		t.Helper()
		var v = new(rlsv3.RateLimitResponse)
		if err := protojson.Unmarshal([]byte(`{"dynamicMetadata":`+s+`}`), v); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		return md(v)
	}

	resp := r.call(t, "m", 1, desc("regular=r"), desc("quota=q"), desc("free=f"))
	want := canon(`{"domain": "m", "hitsAddend": 1,
		"descriptors": [{"entries": ["regular=r"]}, {"entries": ["quota=q"]}, {"entries": ["free=f"]}],
		"metadata": {"name": "service_1", "other": "x", "nested": {"a": 1, "b": 3}}}`)
	if got := md(resp); got != want {
		t.Errorf("both within:\n%s\nwant\n%s", got, want)
	}
	// The quota descriptor over its limit (the only one, so the request is
	// over the limit): the metadata of the others only.
	own := &ratelimitv3.RateLimitDescriptor{
		Entries:    entries("regular=own"),
		Limit:      &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE},
		HitsAddend: wrapperspb.UInt64(2),
	}
	resp = r.call(t, "m", 0, desc("quota=q"), desc("regular=r"), own)
	wantCodes(t, "quota over", resp, over, over, ok, ok)
	want = canon(`{"domain": "m",
		"descriptors": [{"entries": ["quota=q"]}, {"entries": ["regular=r"]}, {"entries": ["regular=own"], "limit": "requests_per_unit:7 unit:MINUTE", "hitsAddend": 2}],
		"metadata": {"name": "service_1", "nested": {"a": 1}}}`)
	if got := md(resp); got != want {
		t.Errorf("quota over:\n%s\nwant\n%s", got, want)
	}
	// Merging never changes the config's metadata.
	if got, _ := protojson.Marshal(c.Match("m", entries("regular=r")).Metadata); canon(`{"x": `+string(got)+`}`) != canon(`{"x": {"name": "service_1", "nested": {"a": 1}}}`) {
		t.Errorf("the config's metadata became %s", got)
	}

	// Off by default.
	c, err = Parse(file)
	if err != nil {
		t.Fatal(err)
	}
	r = serve(t, memstore.New(), c, false)
	if resp := r.call(t, "m", 0, desc("regular=r")); resp.DynamicMetadata != nil {
		t.Errorf("dynamic metadata without the option: %v", resp.DynamicMetadata)
	}
}

// TestGlobalShadowStatuses: under SHADOW_MODE (Options.Shadow) a request
// over its limits is OK while the statuses of the limits over say
// OVER_LIMIT, as envoyproxy/ratelimit's do; a limit's own shadow_mode says
// OK, a quota descriptor over its limit changes nothing, and a limit the
// request sets itself is in shadow mode too.
func TestGlobalShadowStatuses(t *testing.T) {
	c, err := ParseWith(Options{Shadow: true}, File{Name: "s.yaml", Data: []byte(`domain: s
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: own
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: q
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`)})
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, memstore.New(), c, false)
	wantCodes(t, "first", r.call(t, "s", 0, desc("a=1"), desc("own=1"), desc("q=1")), ok, ok, ok, ok)
	wantCodes(t, "all over", r.call(t, "s", 0, desc("a=1"), desc("own=1"), desc("zero=1"), desc("q=1")), ok, over, ok, over, over)
	set := &ratelimitv3.RateLimitDescriptor{
		Entries: entries("a=2"),
		Limit:   &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE},
	}
	wantCodes(t, "a request's own limit", r.call(t, "s", 0, set), ok, ok)
	wantCodes(t, "a request's own limit over", r.call(t, "s", 0, set), ok, over)
}

// TestQuotaRetryAfter: a request denied because every quota descriptor is
// over its limit may be allowed as soon as the first of them has room
// again: Retry-After (drip's headers) follows the shortest of their
// waits, and a quota limit of 0, which no wait cures, does not hide it.
func TestQuotaRetryAfter(t *testing.T) {
	c, err := Parse(File{Name: "r.yaml", Data: []byte(`domain: r
descriptors:
  - key: slow
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: fast
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: zero
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
`)})
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, memstore.New(), c, false)
	retryAfter := func(resp *rlsv3.RateLimitResponse) string {
		for _, h := range resp.ResponseHeadersToAdd {
			if h.Key == "Retry-After" {
				return h.Value
			}
		}
		return ""
	}
	for _, ds := range [][]*ratelimitv3.RateLimitDescriptor{
		{desc("slow=a"), desc("fast=a")},
		{desc("zero=a"), desc("fast=b")},
	} {
		for i := 0; r.call(t, "r", 0, ds...).OverallCode == ok; i++ {
			if i == 3 {
				t.Fatalf("%v: allowed 4 times", ds)
			}
		}
		resp := r.call(t, "r", 0, ds...)
		// fast refills one request in 30 s; the jitter adds at most half.
		if got, err := strconv.Atoi(retryAfter(resp)); err != nil || got < 30 || got > 45 {
			t.Errorf("%v: Retry-After %d (%v), want 30 to 45 (fast's wait, jittered)", ds, got, err)
		}
	}
}

// TestNoWaitCuresHeaders: a request denied by a descriptor that can never
// pass, beside one within its limit, gets RateLimit headers that
// describe the denying limit, and no Retry-After (no wait cures it); the
// other limit is still listed, its bucket as it is (untaken). A limit of
// requests_per_unit 0 is a quota of 0 with nothing remaining and no
// window; a cost above the burst shows its bucket as it is (peeked,
// nothing taken), while its status stays envoyproxy/ratelimit's: over
// the limit, nothing remaining, no duration.
func TestNoWaitCuresHeaders(t *testing.T) {
	c, err := Parse(File{Name: "n.yaml", Data: []byte(`domain: n
descriptors:
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 10, name: open}
  - key: shut
    rate_limit: {unit: minute, requests_per_unit: 0, name: shut}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 5, name: big}
`)})
	if err != nil {
		t.Fatal(err)
	}
	r := serve(t, memstore.New(), c, false)

	resp := r.call(t, "n", 0, desc("open=a"), desc("shut=a"))
	wantCodes(t, "open and shut", resp, over, ok, over)
	wantHeaders(t, resp, map[string]string{
		"RateLimit-Policy":    `"open";q=10;w=60, "shut";q=0`,
		"RateLimit":           `"open";r=10;t=0, "shut";r=0`,
		"RateLimit-Limit":     "0",
		"RateLimit-Remaining": "0",
		"RateLimit-Reset":     "",
		"Retry-After":         "",
	})

	big := desc("big=a")
	big.HitsAddend = wrapperspb.UInt64(6)
	resp = r.call(t, "n", 0, big, desc("open=b"))
	wantCodes(t, "6 of a burst of 5", resp, over, over, ok)
	if st := resp.Statuses[0]; st.LimitRemaining != 0 || st.DurationUntilReset != nil {
		t.Errorf("the status over its burst: %v", st)
	}
	wantHeaders(t, resp, map[string]string{
		"RateLimit-Policy":    `"big";q=5;w=60, "open";q=10;w=60`,
		"RateLimit":           `"big";r=5;t=0, "open";r=10;t=0`,
		"RateLimit-Limit":     "5",
		"RateLimit-Remaining": "5",
		"RateLimit-Reset":     "0",
		"Retry-After":         "",
	})
}

// wantHeaders checks a response's headers against want ("": none) and
// holds them to the ratelimit-headers draft.
func wantHeaders(t *testing.T, resp *rlsv3.RateLimitResponse, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	for k, v := range want {
		if g, ok := got[k]; g != v || (v == "" && ok) {
			t.Errorf("%s: %q (present: %v), want %q", k, g, ok, v)
		}
	}
	if err := sfv.CheckHeaders(func(k string) string { return got[k] }); err != nil {
		t.Error(err)
	}
}
