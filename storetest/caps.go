package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// RunCaps checks the store's capabilities against what it does, and that
// every wrapper of package store forwards them: Prefixed (its overrides
// seen under the prefix), Sharded and Separately. A store that does not
// say SplitsKeys takes several keys of any names in one call.
func RunCaps(t *testing.T, newStore NewStore) {
	st := newStore(t)
	c := st.Caps()
	for _, w := range []store.Store{
		store.Prefixed{Store: st, Prefix: prefix()},
		store.Sharded{Store: st, N: 3},
		store.Separately{Store: st},
		store.Separately{Store: store.Prefixed{Store: store.Sharded{Store: st, N: 2}, Prefix: "x:"}, Always: true},
	} {
		wc := w.Caps()
		if wc.InProcess != c.InProcess || wc.SplitsKeys != c.SplitsKeys || wc.Leases != c.Leases || (wc.Overrides == nil) != (c.Overrides == nil) || (wc.Board == nil) != (c.Board == nil) {
			t.Errorf("%T: caps %+v, want the store's %+v", w, wc, c)
		}
	}
	if !c.SplitsKeys {
		// Keys chosen to land apart on a store that places keys by hash.
		p := prefix()
		rs := make([]drip.Request, 8)
		for i := range rs {
			rs[i] = drip.Request{Key: p + string(rune('a'+i)) + "-caps", Limit: drip.PerSecond(1), Cost: 1}
		}
		if m, err := drip.Apply(ctx(t), st, bucket.Take, base(), rs...); err != nil || !m.Allowed {
			t.Errorf("a store without SplitsKeys refused a take of 8 keys: %+v %v", m, err)
		}
	}
	// Apply writes one result per item and leaves the items as they were,
	// through every wrapper too.
	for _, w := range []store.Store{st, store.Prefixed{Store: st, Prefix: "w:"}, store.Sharded{Store: st, N: 2}, store.Separately{Store: st, Always: true}} {
		p := prefix()
		var items []bucket.Prepared
		for i, l := range []drip.Limit{drip.PerSecond(2), drip.PerMinute(5).Window(), drip.Per(3, time.Second).WithRefill(drip.Interval)} {
			params, err := l.Params(p)
			if err != nil {
				t.Fatal(err)
			}
			var it bucket.Prepared
			if err := store.Prepare(&it, bucket.Take, p+string(rune('a'+i)), &params, 1, false, ""); err != nil {
				t.Fatal(err)
			}
			items = append(items, it)
		}
		before := append([]bucket.Prepared(nil), items...)
		results := make([]bucket.Result, len(items))
		if err := w.Apply(ctx(t), bucket.Take, base(), items, results); err != nil {
			t.Fatalf("%T: %v", w, err)
		}
		for i := range items {
			if items[i] != before[i] {
				t.Errorf("%T changed item %d: %+v, was %+v", w, i, items[i], before[i])
			}
			if !results[i].Allowed {
				t.Errorf("%T: item %d of a first take denied: %+v", w, i, results[i])
			}
		}
	}
	if c.Leases {
		lim := drip.InFlight(1, time.Minute)
		if d, err := Apply(ctx(t), st, bucket.Take, base(), drip.Request{Key: prefix() + "caps-lease", Limit: lim, Lease: "a"}); err != nil || !d.Allowed {
			t.Errorf("a store with Leases refused a lease: %+v %v", d, err)
		}
	}
}

// overridesTurn is RunOverrides' turn in this test binary.
var overridesTurn sync.Mutex

// RunOverrides holds the store's overrides side (Caps.Overrides), seen
// through store.Prefixed under a fresh prefix, to the store.Overrides
// contract: the bound on their number counts new keys only (and every key
// the whole store holds), the version moves on every change and on no
// non-change, OverridesSince returns exactly what changed, and a watcher
// hears that it listens and then every change (unless the store answers
// ErrNoWatch, or WithoutOverrideNotifications is given). A store that
// keeps no overrides has nothing to check.
func RunOverrides(t *testing.T, newStore NewStore, opts ...Option) {
	// The overrides' version and bound are the whole store's: suites run
	// in parallel on one shared server (a test binary's) take turns here,
	// or each would see the other's versions and count its overrides.
	overridesTurn.Lock()
	defer overridesTurn.Unlock()
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	whole := newStore(t)
	inner := whole.Caps().Overrides
	if inner == nil {
		t.Log("the store keeps no overrides (Caps.Overrides is nil)")
		return
	}
	st := store.Prefixed{Store: whole, Prefix: prefix()}.Caps().Overrides
	c, cancel := context.WithTimeout(ctx(t), time.Minute)
	defer cancel()
	// The bound counts what the whole store holds, under other prefixes
	// too (other runs on a shared server).
	_, all, err := inner.Overrides(c)
	if err != nil {
		t.Fatal(err)
	}
	held := len(all)
	heard := make(chan struct{}, 64)
	watchDone := make(chan error, 1)
	watching := !cfg.noNotify
	if watching {
		go func() { watchDone <- st.WatchOverrides(c, func() { heard <- struct{}{} }) }()
	}
	hear := func(what string) {
		t.Helper()
		if !watching {
			return
		}
		select {
		case <-heard:
		case err := <-watchDone:
			if errors.Is(err, store.ErrNoWatch) && what == "listening" {
				watching = false
				return
			}
			t.Fatalf("%s: the watch ended: %v", what, err)
		case <-c.Done():
			t.Fatalf("%s: not heard", what)
		}
	}
	hear("listening")
	v0, err := st.OverridesVersion(c)
	if err != nil {
		t.Fatal(err)
	}
	step := func(what string, f func() error) int64 {
		t.Helper()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		v, err := st.OverridesVersion(c)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	put := func(k string) func() error {
		return func() error { return st.PutOverride(c, k, []byte(`v-`+k), held+2) }
	}
	v1 := step("put a", put("a"))
	hear("put a")
	v2 := step("put b", put("b"))
	hear("put b")
	if err := put("c")(); !errors.Is(err, store.ErrOverridesFull) {
		t.Fatalf("a third key under a bound of 2: %v", err)
	}
	since := func(what string, v int64, wantV int64, want map[string]string) {
		t.Helper()
		got, changed, ok, err := st.OverridesSince(c, v)
		if err != nil || !ok || got != wantV || len(changed) != len(want) {
			t.Fatalf("%s: OverridesSince(%d) = %d %q %v %v, want %d %q", what, v, got, changed, ok, err, wantV, want)
		}
		for k, w := range want {
			if val, has := changed[k]; !has || (w == "" && val != nil) || string(val) != w {
				t.Fatalf("%s: OverridesSince(%d) = %q, want %q", what, v, changed, want)
			}
		}
	}
	since("after two puts", v0, v2, map[string]string{"a": "v-a", "b": "v-b"})
	since("after two puts", v1, v2, map[string]string{"b": "v-b"})
	since("nothing new", v2, v2, nil)
	if _, _, ok, err := st.OverridesSince(c, v2+1000); ok || err != nil {
		t.Fatalf("OverridesSince a version to come: %v %v, want not ok", ok, err)
	}
	v3 := step("put a again", put("a"))
	hear("put a again")
	if !(v0 < v1 && v1 < v2 && v2 < v3) {
		t.Fatalf("versions %d %d %d %d do not grow", v0, v1, v2, v3)
	}
	if found, err := st.DeleteOverride(c, "a"); !found || err != nil {
		t.Fatalf("delete a: %v %v", found, err)
	}
	hear("delete a")
	v4, _ := st.OverridesVersion(c)
	if found, err := st.DeleteOverride(c, "a"); found || err != nil {
		t.Fatalf("delete a again: %v %v", found, err)
	}
	if v, _ := st.OverridesVersion(c); v != v4 || v4 <= v3 {
		t.Fatalf("versions %d, %d after deleting nothing, %d before", v4, v, v3)
	}
	since("after a delete", v3, v4, map[string]string{"a": ""})
	v5 := step("put c", put("c"))
	hear("put c")
	since("a key set twice", v0, v5, map[string]string{"a": "", "b": "v-b", "c": "v-c"})
	v, own, err := st.Overrides(c)
	if err != nil || v != v5 || len(own) != 2 || string(own["b"]) != "v-b" || string(own["c"]) != "v-c" {
		t.Fatalf("Overrides: %d %q %v, want version %d and b, c", v, own, err, v5)
	}
	for _, k := range []string{"b", "c"} {
		if _, err := st.DeleteOverride(c, k); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if watching {
		select {
		case <-watchDone:
		case <-time.After(time.Minute):
			t.Fatal("the watch did not end with its context")
		}
	}
}

// RunBoard holds the store's notice board (Caps.Board), seen through
// store.Prefixed under a fresh prefix, to the store.Board contract: each
// instance's latest blob is read back, with an age by the store's clock
// that is not negative, and only the prefix's instances; a blob drops
// out once its ttl has passed, the others staying; bad arguments are
// refused; and on a store in process (where no other run shares the
// board) a new instance beyond MaxBoardInstances is refused while one
// already there may still put. A store that keeps no board has nothing
// to check.
func RunBoard(t *testing.T, newStore NewStore) {
	whole := newStore(t)
	if whole.Caps().Board == nil {
		t.Log("the store keeps no board (Caps.Board is nil)")
		return
	}
	b := store.Prefixed{Store: whole, Prefix: prefix()}.Caps().Board
	c, cancel := context.WithTimeout(ctx(t), time.Minute)
	defer cancel()
	read := func() map[string]store.Notice {
		t.Helper()
		ns, err := b.ReadBoard(c)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]store.Notice{}
		for _, n := range ns {
			if n.Age < 0 {
				t.Errorf("%s: age %v", n.Instance, n.Age)
			}
			m[n.Instance] = n
		}
		return m
	}
	if m := read(); len(m) != 0 {
		t.Fatalf("a fresh prefix's board: %v", m)
	}
	put := func(inst, blob string, ttl time.Duration) {
		t.Helper()
		if err := b.PutBoard(c, inst, []byte(blob), ttl); err != nil {
			t.Fatalf("put %s: %v", inst, err)
		}
	}
	put("a", "first", time.Minute)
	put("b", "\x00binary\xff", time.Minute)
	put("a", "second", time.Minute)
	put("short", "gone soon", 200*time.Millisecond)
	if err := (store.Prefixed{Store: whole, Prefix: prefix()}).Caps().Board.PutBoard(c, "other", []byte("x"), time.Minute); err != nil {
		t.Fatal(err)
	}
	m := read()
	if string(m["a"].Blob) != "second" || string(m["b"].Blob) != "\x00binary\xff" || m["other"].Instance != "" {
		t.Fatalf("the board: %+v; want a's latest blob, b's, and no other prefix's", m)
	}
	for _, bad := range []struct {
		inst string
		blob []byte
		ttl  time.Duration
	}{
		{"", nil, time.Minute},
		{strings.Repeat("i", store.MaxBoardInstance+1), nil, time.Minute},
		{"c", make([]byte, store.MaxBoardBlob+1), time.Minute},
		{"c", nil, 0},
		{"c", nil, store.MaxBoardTTL + time.Second},
	} {
		if err := b.PutBoard(c, bad.inst, bad.blob, bad.ttl); !errors.Is(err, store.ErrInvalidOp) {
			t.Errorf("put %d-byte name, %d bytes, ttl %v: %v, want ErrInvalidOp", len(bad.inst), len(bad.blob), bad.ttl, err)
		}
	}
	for {
		m := read()
		if _, ok := m["short"]; !ok {
			if len(m) != 2 {
				t.Fatalf("after short's ttl: %+v, want a and b still", m)
			}
			break
		}
		select {
		case <-c.Done():
			t.Fatal("a blob put for 200 ms still on the board after a minute")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if !whole.Caps().InProcess {
		return
	}
	full := false
	for i := range store.MaxBoardInstances + 1 {
		err := b.PutBoard(c, fmt.Sprint("fill", i), nil, time.Minute)
		if errors.Is(err, store.ErrBoardFull) {
			full = true
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !full {
		t.Fatalf("%d instances put, none refused", store.MaxBoardInstances+1)
	}
	put("a", "third", time.Minute)
}
