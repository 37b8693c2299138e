package envoy

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// keysSeen is a KeyObserver that counts what it hears.
type keysSeen struct{ n int }

func (k *keysSeen) Key(string, rules.Mode, engine.Event, *engine.Item) { k.n++ }

// TestKeyObserverAllocatesNothing: telling a key observer about a call's
// descriptors costs the call no allocation (each descriptor's item was
// allocated for it, though only an unlimited one has none of its own).
func TestKeyObserverAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under the race detector, whose sync.Pool drops items")
	}
	c, reqs := twoDescriptors(t, 1)
	req := reqs[0]
	allocs := func(opts ...Option) float64 {
		ms := memstore.New()
		defer ms.Close()
		svc := NewService(ms, c, opts...)
		return testing.AllocsPerRun(500, func() {
			if resp, err := svc.ShouldRateLimit(context.Background(), req); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatal(resp, err)
			}
		})
	}
	seen := &keysSeen{}
	without, with := allocs(), allocs(WithKeys(seen))
	if seen.n == 0 {
		t.Fatal("the key observer heard nothing")
	}
	if with > without {
		t.Errorf("%v allocations a call with a key observer, %v without", with, without)
	}
}
