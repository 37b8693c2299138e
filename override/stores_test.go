package override_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/testserver"
	"github.com/driplimit/drip/internal/teststores"
	"github.com/driplimit/drip/override"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// TestStores holds every store's overrides to the Store contract: the
// bound on their number counts new keys only, the version moves on every
// change and on no non-change, a watcher hears that it listens and then
// every change.
func TestStores(t *testing.T) {
	for _, ts := range teststores.Shared() {
		t.Run(ts.Name, func(t *testing.T) {
			store := ts.Open(t)
			st, ok := override.Of(store)
			if !ok {
				t.Fatal("keeps no overrides")
			}
			ctx, cancel := context.WithTimeout(context.Background(), teststores.Timeout)
			defer cancel()
			// The bound counts what the whole store holds, under other
			// prefixes too (other runs on the shared PostgreSQL).
			held := 0
			if p, ok := store.(drip.Prefixed); ok {
				inner, _ := override.Of(p.Store)
				_, all, err := inner.Overrides(ctx)
				if err != nil {
					t.Fatal(err)
				}
				held = len(all)
			}
			heard := make(chan struct{}, 64)
			watchDone := make(chan error, 1)
			go func() { watchDone <- st.WatchOverrides(ctx, func() { heard <- struct{}{} }) }()
			hear := func(what string) {
				t.Helper()
				select {
				case <-heard:
				case err := <-watchDone:
					t.Fatalf("%s: the watch ended: %v", what, err)
				case <-ctx.Done():
					t.Fatalf("%s: not heard", what)
				}
			}
			hear("listening")
			v0, err := st.OverridesVersion(ctx)
			if err != nil {
				t.Fatal(err)
			}
			step := func(what string, f func() error) int64 {
				t.Helper()
				if err := f(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				v, err := st.OverridesVersion(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			put := func(k string) func() error {
				return func() error { return st.PutOverride(ctx, k, []byte(`v-`+k), held+2) }
			}
			v1 := step("put a", put("a"))
			hear("put a")
			v2 := step("put b", put("b"))
			hear("put b")
			if err := put("c")(); !errors.Is(err, override.ErrFull) {
				t.Fatalf("a third key under a bound of 2: %v", err)
			}
			since := func(what string, v int64, wantV int64, want map[string]string) {
				t.Helper()
				got, changed, ok, err := st.OverridesSince(ctx, v)
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
			if _, _, ok, err := st.OverridesSince(ctx, v2+1000); ok || err != nil {
				t.Fatalf("OverridesSince a version to come: %v %v, want not ok", ok, err)
			}
			v3 := step("put a again", put("a"))
			hear("put a again")
			if !(v0 < v1 && v1 < v2 && v2 < v3) {
				t.Fatalf("versions %d %d %d %d do not grow", v0, v1, v2, v3)
			}
			if found, err := st.DeleteOverride(ctx, "a"); !found || err != nil {
				t.Fatalf("delete a: %v %v", found, err)
			}
			hear("delete a")
			v4, _ := st.OverridesVersion(ctx)
			if found, err := st.DeleteOverride(ctx, "a"); found || err != nil {
				t.Fatalf("delete a again: %v %v", found, err)
			}
			if v, _ := st.OverridesVersion(ctx); v != v4 || v4 <= v3 {
				t.Fatalf("versions %d, %d after deleting nothing, %d before", v4, v, v3)
			}
			since("after a delete", v3, v4, map[string]string{"a": ""})
			v5 := step("put c", put("c"))
			hear("put c")
			since("a key set twice", v0, v5, map[string]string{"a": "", "b": "v-b", "c": "v-c"})
			v, all, err := st.Overrides(ctx)
			if err != nil || v != v5 || len(all) != 2 || string(all["b"]) != "v-b" || string(all["c"]) != "v-c" {
				t.Fatalf("Overrides: %d %q %v, want version %d and b, c", v, all, err, v5)
			}
			for _, k := range []string{"b", "c"} {
				if _, err := st.DeleteOverride(ctx, k); err != nil {
					t.Fatal(err)
				}
			}
			cancel()
			select {
			case <-watchDone:
			case <-time.After(teststores.Timeout):
				t.Fatal("the watch did not end with its context")
			}
		})
	}
}
