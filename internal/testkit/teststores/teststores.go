// Package teststores opens every kind of drip store for end-to-end tests
// that must behave alike on all of them: the memory store, and PostgreSQL,
// Redis and Redis Cluster on the servers internal/testserver shares within
// a test binary (the caller's TestMain stops them: testserver.StopShared,
// testserver.StopSharedPostgres).
//
// It is a package of its own, not part of testserver, because the stores'
// own tests use testserver.
package teststores

import (
	"context"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/store/redisstore"
)

// Timeout is the store deadline of tests whose subject is not the
// deadline: no store on a loaded machine takes that long, so a slow call
// never turns into an on_error decision the test did not ask for. Tests of
// the deadline set their own.
const Timeout = 30 * time.Second

// Store opens one kind of store for a test, closed when the test ends.
type Store struct {
	Name string
	Open func(t *testing.T) store.Store
}

// Shared lists the stores: memory, postgres (schema installed, no
// sweeper), redis and redis-cluster, the last three on shared servers
// under a fresh prefix. On Redis Cluster the keys of one multi-take
// usually land in different hash slots: such a multi-take fails with
// store.ErrNotColocated, as it would in production.
func Shared() []Store {
	return []Store{
		{"memory", func(t *testing.T) store.Store {
			s := memstore.New()
			t.Cleanup(func() { s.Close() })
			return s
		}},
		{"postgres", func(t *testing.T) store.Store {
			s, err := pgstore.Open(context.Background(), testserver.SharedPostgres(t).URL(),
				pgstore.WithInstall(pgstore.InstallOptions{}), pgstore.WithSweep(0))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return store.Prefixed{Store: s, Prefix: testserver.Prefix()}
		}},
		{"redis", func(t *testing.T) store.Store {
			return openRedis(t, testserver.SharedRedisURL(t))
		}},
		{"redis-cluster", func(t *testing.T) store.Store {
			return openRedis(t, testserver.SharedRedisClusterURL(t))
		}},
	}
}

// Open is the store of Shared named name.
func Open(t *testing.T, name string) store.Store {
	t.Helper()
	for _, s := range Shared() {
		if s.Name == name {
			return s.Open(t)
		}
	}
	t.Fatalf("teststores: no store %q", name)
	return nil
}

func openRedis(t *testing.T, url string) store.Store {
	s, err := redisstore.Open(url, redisstore.WithPrefix(testserver.Prefix()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
