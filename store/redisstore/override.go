package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/driplimit/drip/store"
)

// Overrides (package override) live in one hash, {prefix}overrides
// (field: bucket key, value: the override as JSON), with a version key
// that every change bumps and a message on a pub/sub channel, all three
// named after the prefix, and a record of the latest changes (a sorted
// set of keys by the version of their change, and its floor) for
// OverridesSince. Changes run in one script (override.lua), and so does
// reading what changed (override_since.lua): the keys share a hash tag,
// so they land on one Cluster slot.

var _ store.Overrides = (*Store)(nil)

//go:embed override.lua
var overrideLua string

//go:embed override_since.lua
var overrideSinceLua string

var (
	overrideScript      = rueidis.NewLuaScript(overrideLua)
	overrideSinceScript = rueidis.NewLuaScript(overrideSinceLua)
)

func (s *Store) overrideKeys() (hash, version, channel string) {
	tag := "{" + s.prefix + "overrides}"
	return tag, tag + ":version", s.prefix + "overrides"
}

// changeKeys are the keys of override.lua and override_since.lua.
func (s *Store) changeKeys() []string {
	h, v, _ := s.overrideKeys()
	return []string{h, v, h + ":changes", h + ":changelog"}
}

func (s *Store) changeOverride(ctx context.Context, args ...string) (int64, error) {
	_, _, ch := s.overrideKeys()
	return overrideScript.Exec(ctx, s.c, s.changeKeys(), append(args, ch, strconv.Itoa(store.KeepChanges))).AsInt64()
}

// PutOverride implements store.Overrides.
func (s *Store) PutOverride(ctx context.Context, key string, val []byte, max int) error {
	n, err := s.changeOverride(ctx, "put", key, string(val), strconv.Itoa(max))
	if err == nil && n < 0 {
		err = store.ErrOverridesFull
	}
	return err
}

// DeleteOverride implements store.Overrides.
func (s *Store) DeleteOverride(ctx context.Context, key string) (bool, error) {
	n, err := s.changeOverride(ctx, "del", key, "", "0")
	return n > 0, err
}

// OverridesVersion implements store.Overrides.
func (s *Store) OverridesVersion(ctx context.Context) (int64, error) {
	_, v, _ := s.overrideKeys()
	n, err := s.c.Do(ctx, s.c.B().Get().Key(v).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	return n, err
}

// Overrides implements store.Overrides.
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

// OverridesSince implements store.Overrides.
func (s *Store) OverridesSince(ctx context.Context, since int64) (int64, map[string][]byte, bool, error) {
	r, err := overrideSinceScript.Exec(ctx, s.c, s.changeKeys(), []string{strconv.FormatInt(since, 10)}).ToArray()
	if err != nil {
		return 0, nil, false, err
	}
	if len(r) != 2 && len(r) != 4 {
		return 0, nil, false, errors.New("redisstore: override_since.lua: unexpected reply")
	}
	v, err := r[0].AsInt64()
	if err != nil {
		return 0, nil, false, err
	}
	if ok, err := r[1].AsInt64(); err != nil || ok == 0 || len(r) != 4 {
		return v, nil, false, err
	}
	keys, err := r[2].AsStrSlice()
	if err != nil {
		return 0, nil, false, err
	}
	vals, err := r[3].ToArray()
	if err != nil || len(vals) != len(keys) {
		return 0, nil, false, errors.Join(errors.New("redisstore: override_since.lua: unexpected reply"), err)
	}
	changed := make(map[string][]byte, len(keys))
	for i, k := range keys {
		changed[k] = nil
		if val, err := vals[i].ToString(); err == nil {
			changed[k] = []byte(val)
		} else if !rueidis.IsRedisNil(err) {
			return 0, nil, false, err
		}
	}
	return v, changed, true, nil
}

// WatchOverrides implements store.Overrides: SUBSCRIBE to the channel (on
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
