package main

import (
	"context"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/redisstore"
)

// openRedis opens a redis:// or rediss:// store URL: one server, or a
// whole Redis Cluster from one of its nodes (more seeds as ?addr=).
func openRedis(_ context.Context, url string) (drip.Store, func(), error) {
	s, err := redisstore.Open(url)
	if err != nil {
		return nil, nil, err
	}
	return s, func() { s.Close() }, nil
}
