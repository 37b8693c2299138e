package main

import (
	"context"

	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/redisstore"
)

// openRedis opens a redis://, rediss://, redis+sentinel:// or
// rediss+sentinel:// store URL: one server, a whole Redis Cluster from one
// of its nodes (more nodes to start from as ?addr=), or the master a set
// of Sentinels names (see redisstore.ParseURL).
func openRedis(_ context.Context, url string, opts ...redisstore.Option) (store.Store, func(), error) {
	s, err := redisstore.Open(url, opts...)
	if err != nil {
		return nil, nil, err
	}
	return s, func() { s.Close() }, nil
}
