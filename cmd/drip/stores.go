package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/driplimit/drip/internal/redact"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/redisstore"
)

// openStore opens the store a --store URL names, a Redis store with
// redisOpts. Each store package adds its scheme here.
// Its errors never show the URL's password.
func openStore(ctx context.Context, url string, redisOpts ...redisstore.Option) (store.Store, func(), error) {
	s, closeStore, err := openStoreURL(ctx, url, redisOpts)
	return s, closeStore, redact.Error(err)
}

func openStoreURL(ctx context.Context, url string, redisOpts []redisstore.Option) (store.Store, func(), error) {
	switch {
	case url == "" || url == "memory" || strings.HasPrefix(url, "memory:"):
		s := memstore.New()
		return s, func() { s.Close() }, nil
	case strings.HasPrefix(url, "redis://") || strings.HasPrefix(url, "rediss://") ||
		strings.HasPrefix(url, "redis+sentinel://") || strings.HasPrefix(url, "rediss+sentinel://"):
		return openRedis(ctx, url, redisOpts...)
	case strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://"):
		return openPostgres(ctx, url)
	}
	return nil, nil, fmt.Errorf("unknown store %q: want memory, or a postgres://, redis://, rediss:// or redis+sentinel:// URL", redact.URL(url))
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}
