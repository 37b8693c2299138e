package override_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/rueidis"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/store/redisstore"
)

func TestMain(m *testing.M) { testserver.Main(m) }

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
