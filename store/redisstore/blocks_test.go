package redisstore_test

import (
	"testing"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

// TestBlocks holds the blocks of leased limits on Redis to the exact
// model, on one server (storetest.RunBlocks); as a script, on a cluster
// and on Sentinel (TestConformanceSentinel) the same decision code gets
// the same calls, and one random trace of the four
// (storetest.RunBlocksTransport) covers each way there. Plain requests
// in RunBlocks go to the same keys as the blocks, so they are held to
// the blocks' cap too.
func TestBlocks(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t))
	storetest.RunBlocks(t, func(t *testing.T) store.Store { return s })
}

// TestBlocksScripts runs the same on a server with functions, as a
// script (EVALSHA): the code a server without functions runs.
func TestBlocksScripts(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t), redisstore.WithScripts())
	storetest.RunBlocksTransport(t, func(t *testing.T) store.Store { return s })
}

func TestBlocksCluster(t *testing.T) {
	t.Parallel()
	c := open(t, testserver.SharedRedisClusterURL(t)).Client()
	storetest.RunBlocksTransport(t, func(t *testing.T) store.Store {
		return redisstore.New(c, redisstore.WithPrefix("drip:{"+randomTag()+"}:"))
	})
}
