package main

import (
	"math/rand"
	"net"
	"os"
	"time"

	"github.com/coocood/freecache"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconfig "github.com/envoyproxy/ratelimit/src/config"
	rlprovider "github.com/envoyproxy/ratelimit/src/provider"
	rlredis "github.com/envoyproxy/ratelimit/src/redis"
	rlserver "github.com/envoyproxy/ratelimit/src/server"
	rlservice "github.com/envoyproxy/ratelimit/src/service"
	rlsettings "github.com/envoyproxy/ratelimit/src/settings"
	rlstats "github.com/envoyproxy/ratelimit/src/stats"
	rlutils "github.com/envoyproxy/ratelimit/src/utils"
	gostats "github.com/lyft/gostats"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
)

type peerConfig struct{ cfg rlconfig.RateLimitConfig }

func (p peerConfig) GetConfig() (rlconfig.RateLimitConfig, any) { return p.cfg, nil }

type peerProvider struct {
	ch chan rlprovider.ConfigUpdateEvent
}

func (p peerProvider) ConfigUpdateEvent() <-chan rlprovider.ConfigUpdateEvent { return p.ch }
func (p peerProvider) Stop()                                                  {}

// peerLocalCache is LOCAL_CACHE_SIZE_IN_BYTES: 100 MiB.
const peerLocalCache = 100 << 20

// servePeer serves envoyproxy/ratelimit's service on addr over the Redis
// at redisAddr, put together as its runner does (src/service_cmd/runner)
// with its default settings, LOCAL_CACHE_SIZE_IN_BYTES set (a freecache
// of over-limit keys) and stats to a null sink (USE_STATSD=false).
func servePeer(addr, redisAddr, configFile string) {
	logrus.SetLevel(logrus.ErrorLevel)
	yaml, err := os.ReadFile(configFile)
	check(err)
	s := rlsettings.NewSettings()
	sink := gostats.NewStore(gostats.NewNullSink(), false)
	statsManager := rlstats.NewStatManager(sink, s)
	localCache := freecache.NewCache(peerLocalCache)
	client := rlredis.NewClientImpl(sink.Scope("redis_pool"), false, "", "tcp", s.RedisType, redisAddr, s.RedisPoolSize,
		s.RedisPipelineWindow, s.RedisPipelineLimit, nil, false, nil, s.RedisTimeout, s.RedisPoolOnEmptyBehavior, "")
	cache := rlredis.NewFixedRateLimitCacheImpl(client, nil, rlutils.NewTimeSourceImpl(),
		rand.New(rlutils.NewLockedSource(time.Now().Unix())), s.ExpirationJitterMaxSeconds, localCache,
		s.NearLimitRatio, s.CacheKeyPrefix, statsManager, s.StopCacheKeyIncrementWhenOverlimit)
	cfg := rlconfig.NewRateLimitConfigImpl([]rlconfig.RateLimitConfigToLoad{
		{Name: "edge.yaml", ConfigYaml: rlconfig.ConfigFileContentToYaml("edge.yaml", string(yaml))},
	}, statsManager, false)
	events := make(chan rlprovider.ConfigUpdateEvent, 1)
	events <- peerConfig{cfg}
	checker := rlserver.NewHealthChecker(health.NewServer(), "ratelimit", false)
	svc := rlservice.NewService(cache, peerProvider{events}, statsManager, checker, rlutils.NewTimeSourceImpl(),
		s.GlobalShadowMode, false, false)
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, svc)
	ln, err := net.Listen("tcp", addr)
	check(err)
	check(gs.Serve(ln))
}
