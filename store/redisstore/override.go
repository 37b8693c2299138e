package redisstore

import (
	"context"
	_ "embed"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/driplimit/drip/override"
)

// Overrides (package override) live in one hash, {prefix}overrides
// (field: bucket key, value: the override as JSON), with a version key
// that every change bumps and a message on a pub/sub channel, all three
// named after the prefix. Changes run in one script (override.lua): the
// hash and version share a hash tag, so they land on one Cluster slot.

var _ override.Store = (*Store)(nil)

//go:embed override.lua
var overrideLua string

var overrideScript = rueidis.NewLuaScript(overrideLua)

func (s *Store) overrideKeys() (hash, version, channel string) {
	tag := "{" + s.prefix + "overrides}"
	return tag, tag + ":version", s.prefix + "overrides"
}

func (s *Store) changeOverride(ctx context.Context, args ...string) (int64, error) {
	h, v, ch := s.overrideKeys()
	return overrideScript.Exec(ctx, s.c, []string{h, v}, append(args, ch)).AsInt64()
}

// PutOverride implements override.Store.
func (s *Store) PutOverride(ctx context.Context, key string, val []byte, max int) error {
	n, err := s.changeOverride(ctx, "put", key, string(val), strconv.Itoa(max))
	if err == nil && n < 0 {
		err = override.ErrFull
	}
	return err
}

// DeleteOverride implements override.Store.
func (s *Store) DeleteOverride(ctx context.Context, key string) (bool, error) {
	n, err := s.changeOverride(ctx, "del", key, "", "0")
	return n > 0, err
}

// OverridesVersion implements override.Store.
func (s *Store) OverridesVersion(ctx context.Context) (int64, error) {
	_, v, _ := s.overrideKeys()
	n, err := s.c.Do(ctx, s.c.B().Get().Key(v).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	return n, err
}

// Overrides implements override.Store.
func (s *Store) Overrides(ctx context.Context) (int64, map[string][]byte, error) {
	ver, err := s.OverridesVersion(ctx)
	if err != nil {
		return 0, nil, err
	}
	h, _, _ := s.overrideKeys()
	m, err := s.c.Do(ctx, s.c.B().Hgetall().Key(h).Build()).AsStrMap()
	if err != nil {
		return 0, nil, err
	}
	all := make(map[string][]byte, len(m))
	for k, v := range m {
		all[k] = []byte(v)
	}
	return ver, all, nil
}

// WatchOverrides implements override.Store: SUBSCRIBE to the channel (on
// Redis Cluster a PUBLISH reaches every node; through Sentinel the client
// follows the master).
func (s *Store) WatchOverrides(ctx context.Context, changed func()) error {
	_, _, ch := s.overrideKeys()
	ctx = rueidis.WithOnSubscriptionHook(ctx, func(sub rueidis.PubSubSubscription) {
		if sub.Kind == "subscribe" { // also after a reconnection: changes may have been missed
			changed()
		}
	})
	return s.c.Receive(ctx, s.c.B().Subscribe().Channel(ch).Build(), func(rueidis.PubSubMessage) { changed() })
}
