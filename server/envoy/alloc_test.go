package envoy

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
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

// held is a store whose calls wait for release, each telling entered
// first.
type held struct {
	store.Store
	entered chan struct{}
	release chan struct{}
}

func (h *held) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	h.entered <- struct{}{}
	<-h.release
	return h.Store.Apply(ctx, op, at, items, results)
}

// TestCallsBeyondStreamWorkers: with every kept stream worker busy (each
// call held in the store), more calls still run, each on a goroutine of
// its own, and all are answered.
func TestCallsBeyondStreamWorkers(t *testing.T) {
	n := streamWorkers + 16
	c, reqs := twoDescriptors(t, n) // keys of their own: no call waits behind another's
	ms := memstore.New()
	t.Cleanup(func() { ms.Close() })
	h := &held{Store: ms, entered: make(chan struct{}, n), release: make(chan struct{})}
	r := serve(t, h, c, false)
	released := false
	release := func() {
		if !released {
			released = true
			close(h.release)
		}
	}
	defer release() // before the server's shutdown, which waits for the calls
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Connections enough for n calls at once (MaxConcurrentStreams each).
	clients := []rlsv3.RateLimitServiceClient{r.client}
	for len(clients)*100 < n {
		conn, err := grpc.NewClient(r.conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	errs := make(chan error, n)
	for i := range n {
		go func() {
			resp, err := clients[i%len(clients)].ShouldRateLimit(ctx, reqs[i])
			if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
				err = fmt.Errorf("answered %v", resp.OverallCode)
			}
			errs <- err
		}()
	}
	for i := range n {
		select {
		case <-h.entered:
		case <-ctx.Done():
			t.Fatalf("%d of %d calls reached the store (%d stream workers)", i, n, streamWorkers)
		}
	}
	release()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
