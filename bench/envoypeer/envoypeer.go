// Package envoypeer puts envoyproxy/ratelimit's rate limit service
// together from its Go module as its runner does (src/service_cmd/runner),
// for the benchmarks that measure drip beside it: the in-process ones of
// package bench and the processes of procbench.
package envoypeer

import (
	"math/rand"
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

// Config is what differs between the benchmarks' peers; everything else
// is envoyproxy/ratelimit's default settings (a pool of 10 connections,
// no pipelining window) with stats to a null sink (USE_STATSD=false).
type Config struct {
	// Redis is the address (host:port) of its Redis.
	Redis string
	// Name and YAML are its configuration file's name and contents.
	Name, YAML string
	// Prefix is CACHE_KEY_PREFIX, put before its Redis keys ("": none).
	Prefix string
	// LocalCacheBytes is LOCAL_CACHE_SIZE_IN_BYTES: the bound of its
	// freecache of over-limit keys (0: no local cache, its default).
	LocalCacheBytes int
}

// NewServer returns a gRPC server of envoyproxy/ratelimit's service as c
// sets it up, and a function that closes its Redis pool (after the
// server has stopped).
func NewServer(c Config) (*grpc.Server, func()) {
	logrus.SetLevel(logrus.ErrorLevel) // its pool logs its setup as warnings
	s := rlsettings.NewSettings()
	sink := gostats.NewStore(gostats.NewNullSink(), false)
	statsManager := rlstats.NewStatManager(sink, s)
	var localCache *freecache.Cache
	if c.LocalCacheBytes > 0 {
		localCache = freecache.NewCache(c.LocalCacheBytes)
	}
	client := rlredis.NewClientImpl(sink.Scope("redis_pool"), false, "", "tcp", s.RedisType, c.Redis, s.RedisPoolSize,
		s.RedisPipelineWindow, s.RedisPipelineLimit, nil, false, nil, s.RedisTimeout, s.RedisPoolOnEmptyBehavior, "")
	cache := rlredis.NewFixedRateLimitCacheImpl(client, nil, rlutils.NewTimeSourceImpl(),
		rand.New(rlutils.NewLockedSource(time.Now().Unix())), s.ExpirationJitterMaxSeconds, localCache,
		s.NearLimitRatio, c.Prefix, statsManager, s.StopCacheKeyIncrementWhenOverlimit)
	cfg := rlconfig.NewRateLimitConfigImpl([]rlconfig.RateLimitConfigToLoad{
		{Name: c.Name, ConfigYaml: rlconfig.ConfigFileContentToYaml(c.Name, c.YAML)},
	}, statsManager, false)
	events := make(chan rlprovider.ConfigUpdateEvent, 1)
	events <- loaded{cfg}
	checker := rlserver.NewHealthChecker(health.NewServer(), "ratelimit", false)
	svc := rlservice.NewService(cache, provider{events}, statsManager, checker, rlutils.NewTimeSourceImpl(),
		s.GlobalShadowMode, false, false)
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, svc)
	return gs, func() { client.Close() }
}

// loaded is the one configuration the service loads.
type loaded struct{ cfg rlconfig.RateLimitConfig }

func (l loaded) GetConfig() (rlconfig.RateLimitConfig, any) { return l.cfg, nil }

type provider struct {
	ch chan rlprovider.ConfigUpdateEvent
}

func (p provider) ConfigUpdateEvent() <-chan rlprovider.ConfigUpdateEvent { return p.ch }
func (p provider) Stop()                                                  {}
