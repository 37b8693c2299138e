package override_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/rueidis"

	"github.com/driplimit/drip/internal/testserver"
	"github.com/driplimit/drip/internal/teststores"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/store/redisstore"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// TestStores holds every store's overrides to the Store contract: the
// bound on their number counts new keys only, the version moves on every
// change and on no non-change, a watcher hears that it listens and then
// every change.
func TestStores(t *testing.T) {
	for _, ts := range teststores.Shared() {
		t.Run(ts.Name, func(t *testing.T) {
			whole := ts.Open(t)
			st := whole.Caps().Overrides
			if st == nil {
				t.Fatal("keeps no overrides")
			}
			ctx, cancel := context.WithTimeout(context.Background(), teststores.Timeout)
			defer cancel()
			// The bound counts what the whole store holds, under other
			// prefixes too (other runs on the shared PostgreSQL).
			held := 0
			if p, ok := whole.(store.Prefixed); ok {
				inner := p.Store.Caps().Overrides
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
			if err := put("c")(); !errors.Is(err, store.ErrOverridesFull) {
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

// olderDrips make a change as a drip before OverridesSince did (a
// rolling upgrade): the value and the version, no record of the change
// nor count of the overrides. Each opens its store on a server the test
// shares, under a fresh prefix, and the whole store, whose overrides the
// bound counts.
var olderDrips = []struct {
	name string
	open func(t *testing.T) (st, whole store.Overrides, change func(ctx context.Context, key string) error)
}{
	{"postgres", func(t *testing.T) (store.Overrides, store.Overrides, func(context.Context, string) error) {
		url, p := testserver.SharedPostgres(t).URL(), testserver.Prefix()
		s, err := pgstore.Open(context.Background(), url, pgstore.WithInstall(pgstore.InstallOptions{}), pgstore.WithSweep(0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		db, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		st := store.Prefixed{Store: s, Prefix: p}.Caps().Overrides
		return st, s, func(ctx context.Context, key string) error {
			_, err := db.Exec(ctx, `WITH v AS (UPDATE drip.overrides_version SET version = version + 1 RETURNING 1)
INSERT INTO drip.overrides (key, value) SELECT convert_to($1::text, 'UTF8'), convert_to('v-' || $2::text, 'UTF8') FROM v`, p+key, key)
			return err
		}
	}},
	{"redis", redisOlder(testserver.SharedRedisURL)},
	{"redis-cluster", redisOlder(testserver.SharedRedisClusterURL)},
}

func redisOlder(url func(testing.TB) string) func(t *testing.T) (store.Overrides, store.Overrides, func(context.Context, string) error) {
	return func(t *testing.T) (store.Overrides, store.Overrides, func(context.Context, string) error) {
		u, p := url(t), testserver.Prefix()
		s, err := redisstore.Open(u, redisstore.WithPrefix(p))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		o, err := rueidis.ParseURL(u)
		if err != nil {
			t.Fatal(err)
		}
		c, err := rueidis.NewClient(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		tag := "{" + p + "overrides}"
		return s, s, func(ctx context.Context, key string) error {
			if err := c.Do(ctx, c.B().Hset().Key(tag).FieldValue().FieldValue(key, "v-"+key).Build()).Error(); err != nil {
				return err
			}
			return c.Do(ctx, c.B().Incr().Key(tag+":version").Build()).Error()
		}
	}
}

// TestStoresUnrecordedChange: a change made by an older drip leaves
// OverridesSince unable to tell what changed before it, so followers load
// every override, until a change is recorded; from that change's version
// on it can tell again, and the bound counts the override the older drip
// added.
func TestStoresUnrecordedChange(t *testing.T) {
	for _, od := range olderDrips {
		t.Run(od.name, func(t *testing.T) {
			st, whole, older := od.open(t)
			ctx, cancel := context.WithTimeout(context.Background(), teststores.Timeout)
			defer cancel()
			_, all, err := whole.Overrides(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held := len(all)
			put := func(k string, max int) (int64, error) {
				if err := st.PutOverride(ctx, k, []byte("v-"+k), max); err != nil {
					return 0, err
				}
				return st.OverridesVersion(ctx)
			}
			since := func(v int64) (map[string][]byte, bool) {
				t.Helper()
				_, changed, ok, err := st.OverridesSince(ctx, v)
				if err != nil {
					t.Fatal(err)
				}
				return changed, ok
			}
			v1, err := put("a", held+10)
			if err != nil {
				t.Fatal(err)
			}
			if err := older(ctx, "b"); err != nil {
				t.Fatal(err)
			}
			if _, ok := since(v1); ok {
				t.Fatal("OverridesSince tells the changes across an unrecorded one")
			}
			v3, err := put("c", held+10)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := since(v1); ok {
				t.Fatal("OverridesSince tells the changes across an unrecorded one, after a recorded one")
			}
			if changed, ok := since(v3 - 1); !ok || len(changed) != 1 || string(changed["c"]) != "v-c" {
				t.Fatalf("since the unrecorded change: %q %v, want c", changed, ok)
			}
			if _, err := put("d", held+3); !errors.Is(err, store.ErrOverridesFull) {
				t.Fatalf("a fourth override under a bound of 3: %v", err)
			}
			for _, k := range []string{"a", "b", "c"} {
				if found, err := st.DeleteOverride(ctx, k); !found || err != nil {
					t.Fatal(k, found, err)
				}
			}
		})
	}
}
