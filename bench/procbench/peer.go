package main

import (
	"net"
	"os"

	"github.com/driplimit/drip/bench/envoypeer"
)

// peerLocalCache is LOCAL_CACHE_SIZE_IN_BYTES: 100 MiB.
const peerLocalCache = 100 << 20

// servePeer serves envoyproxy/ratelimit's service on addr over the Redis
// at redisAddr (envoypeer: as its runner puts it together, with its
// default settings), LOCAL_CACHE_SIZE_IN_BYTES set.
func servePeer(addr, redisAddr, configFile string) {
	yaml, err := os.ReadFile(configFile)
	check(err)
	gs, _ := envoypeer.NewServer(envoypeer.Config{Redis: redisAddr, Name: "edge.yaml", YAML: string(yaml), LocalCacheBytes: peerLocalCache})
	ln, err := net.Listen("tcp", addr)
	check(err)
	check(gs.Serve(ln))
}
