package envoy

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
)

const leasedConfig = `
domain: d
descriptors:
  - {key: a, rate_limit: {unit: day, requests_per_unit: 20}}
  - {key: b, rate_limit: {unit: day, requests_per_unit: 20, leased: false}}
  - {key: c, rate_limit: {unit: day, requests_per_unit: 20, leased: true}}
`

// TestLeasedSetting: a rate_limit's leased: true marks its limit leased,
// and DRIP_ENVOY_LEASED=true every limit without its own leased; a
// limit of 0 or an unlimited one cannot be leased.
func TestLeasedSetting(t *testing.T) {
	o, err := OptionsFromEnv(func(k string) string { return map[string]string{"DRIP_ENVOY_LEASED": "true"}[k] })
	if err != nil || !o.Leased {
		t.Fatalf("%+v %v", o, err)
	}
	for _, tc := range []struct {
		opts Options
		want string // the leased of a, b, c
	}{
		{Options{}, "--+"},
		{o, "+-+"},
	} {
		c, err := ParseWith(tc.opts, File{Name: "f.yaml", Data: []byte(leasedConfig)})
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, k := range []string{"a=1", "b=1", "c=1"} {
			if c.Match("d", entries(k)).Limit.Leased {
				got += "+"
			} else {
				got += "-"
			}
		}
		if got != tc.want {
			t.Errorf("leased with %+v: %s, want %s (a, b, c)", tc.opts, got, tc.want)
		}
	}
	for cfg, want := range map[string]string{
		"{key: a, rate_limit: {unlimited: true, leased: true}}":                       ".leased: needs a limit of requests_per_unit > 0",
		"{key: a, rate_limit: {unit: day, requests_per_unit: 0, leased: true}}":       ".leased: needs a limit of requests_per_unit > 0",
		"{key: a, rate_limit: {unit: day, requests_per_unit: 5, leased: yes please}}": ".leased: must be true or false",
	} {
		_, err := Parse(File{Name: "f.yaml", Data: []byte("domain: d\ndescriptors:\n  - " + cfg + "\n")})
		if err == nil || !strings.Contains(err.Error(), "descriptors[0].rate_limit"+want) {
			t.Errorf("%s: %v, want %q", cfg, err, want)
		}
	}
	if _, err := OptionsFromEnv(func(k string) string { return map[string]string{"DRIP_ENVOY_LEASED": "maybe"}[k] }); err == nil {
		t.Error("DRIP_ENVOY_LEASED=maybe accepted")
	}
}

// fetchedBy counts the blocks fetched per bucket key.
type fetchedBy struct {
	mu sync.Mutex
	n  map[string]int
}

func (f *fetchedBy) BlockFetched(key string, _ int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n[key]++
}
func (*fetchedBy) BlockReturned(string, int64) {}
func (*fetchedBy) BlockExpired(string, int64)  {}

// TestLeasedDescriptors: on a wrapper that leases the marked limits
// only, in virtual time, the plain limit of 20 a day grants exactly 20
// of 60 requests and takes no block; the leased one takes blocks, grants
// at most 20, and once the wrapper has given its blocks back the store
// grants exactly the rest.
func TestLeasedDescriptors(t *testing.T) {
	cfg, err := Parse(File{Name: "f.yaml", Data: []byte(leasedConfig)})
	if err != nil {
		t.Fatal(err)
	}
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	ck := testclock.At(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	obs := &fetchedBy{n: map[string]int{}}
	ls, err := leased.New(ms, leased.LeaseInProcess(), leased.Marked(), leased.WithClock(ck.Now), leased.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	ok := func(svc *Service, key string) int {
		n := 0
		for range 60 {
			ck.Add(time.Millisecond)
			resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: entries(key)}}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				n++
			}
		}
		return n
	}
	svc := NewService(ls, cfg, engine.WithClock(ck.Now), engine.WithTimeout(30*time.Second))
	if n := ok(svc, "b=1"); n != 20 {
		t.Errorf("plain: %d of 60 OK, want 20", n)
	}
	hot := ok(svc, "c=1")
	ls.Close()
	rest := ok(NewService(ms, cfg, engine.WithClock(ck.Now), engine.WithTimeout(30*time.Second)), "c=1")
	if hot > 20 || hot+rest != 20 {
		t.Errorf("leased: %d of 60 OK, then %d from the store; want at most 20, and 20 in all", hot, rest)
	}
	plainKey := bucketKey("d", entries("b=1"), nil)
	leasedKey := bucketKey("d", entries("c=1"), nil)
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.n[plainKey] != 0 || obs.n[leasedKey] == 0 || len(obs.n) != 1 {
		t.Errorf("blocks fetched by key: %v; want some of the leased limit's only", obs.n)
	}
}
