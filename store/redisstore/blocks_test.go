package redisstore_test

import (
	"testing"

	"github.com/driplimit/drip/internal/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

// TestBlocks holds the blocks of leased limits on Redis to the exact
// model, on one server and on a cluster.
func TestBlocks(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t))
	storetest.RunBlocks(t, func(t *testing.T) store.Store { return s })
}

func TestBlocksCluster(t *testing.T) {
	c := open(t, testserver.SharedRedisClusterURL(t)).Client()
	storetest.RunBlocks(t, func(t *testing.T) store.Store {
		return redisstore.New(c, redisstore.WithPrefix("drip:{"+randomTag()+"}:"))
	})
}
