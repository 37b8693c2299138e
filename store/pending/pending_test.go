package pending_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/pending"
)

var errDown = errors.New("dial tcp 127.0.0.1:1: connect: connection refused")

// TestPending: calls fail with ErrNotConnected while open fails; the
// attempts back off (250 ms at first, doubling, at most the backoff's
// Max, each jittered down to half); once open succeeds every call goes
// to the store it opened, and Close closes it.
func TestPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var attempts []time.Duration
		start := time.Now()
		inner := memstore.New()
		var closed atomic.Bool
		open := func(context.Context) (store.Store, func(), error) {
			attempts = append(attempts, time.Since(start))
			if len(attempts) < 6 {
				return nil, nil, errDown
			}
			return inner, func() { closed.Store(true); inner.Close() }, nil
		}
		caps := store.Caps{Leases: true, Sliding: true}
		p := pending.New(caps, open, pending.Backoff{Min: 250 * time.Millisecond, Max: time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		req := drip.Request{Key: "k", Limit: drip.Limit{Rate: 1, Period: time.Hour, Burst: 1}, Cost: 1}
		if _, err := drip.Apply(t.Context(), p, bucket.Take, time.Time{}, req); !errors.Is(err, pending.ErrNotConnected) {
			t.Fatalf("before the store opened: %v, want ErrNotConnected", err)
		}
		if _, err := p.OverridesVersion(t.Context()); !errors.Is(err, pending.ErrNotConnected) {
			t.Fatalf("overrides before the store opened: %v", err)
		}
		if c := p.Caps(); !c.Leases || !c.Sliding || c.Overrides != p || c.Board != p {
			t.Fatalf("caps: %+v", c)
		}
		if _, err := p.ReadBoard(t.Context()); !errors.Is(err, pending.ErrNotConnected) {
			t.Fatalf("the board before the store opened: %v", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		// The waits before attempts: 250 ms, 500 ms, 1 s, 1 s, 1 s, 1 s,
		// each jittered to between half and all of it.
		prev := time.Duration(0)
		for i, at := range attempts {
			full := min(250*time.Millisecond<<i, time.Second)
			if w := at - prev; w < full/2 || w > full {
				t.Errorf("attempt %d after %v, want between %v and %v", i+1, w, full/2, full)
			}
			prev = at
		}
		if len(attempts) != 6 || !p.Connected() {
			t.Fatalf("%d attempts, connected %v", len(attempts), p.Connected())
		}
		for _, want := range []bool{true, false} {
			d, err := drip.Apply(t.Context(), p, bucket.Take, time.Time{}, req)
			if err != nil || d.Allowed != want {
				t.Fatalf("once open: %+v %v, want allowed %v", d, err, want)
			}
		}
		p.Close()
		if !closed.Load() {
			t.Fatal("Close did not close the store")
		}
	})
}

// TestPendingClosed: Close while attempts fail stops them; a store that
// opens after Close is closed at once.
func TestPendingClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var closed atomic.Bool
		open := func(context.Context) (store.Store, func(), error) {
			<-release
			m := memstore.New()
			return m, func() { closed.Store(true); m.Close() }, nil
		}
		p := pending.New(store.Caps{}, open, pending.DefaultBackoff, slog.New(slog.NewTextHandler(io.Discard, nil)))
		time.Sleep(time.Second) // the attempt is under way
		p.Close()
		close(release)
		synctest.Wait()
		if !closed.Load() || p.Connected() {
			t.Fatalf("a store opened after Close: closed %v, connected %v", closed.Load(), p.Connected())
		}
	})
}
