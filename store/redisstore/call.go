package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/redis/rueidis"
)

// The decision code (bigint.lua, then decide.lua, which defines main) runs
// in one of two forms; no code is ever built from input.
//
//   - A Redis Function (Redis 7 and Valkey): a library loaded once with
//     FUNCTION LOAD, called with FCALL. The library keeps its closures
//     between calls, where a script runs all of its definitions (some
//     thirty closures) again on every call: measured on Redis 7.0, that
//     setup was about 17 µs of a lone decision's 35 µs. The library is
//     named after its code's hash, so two versions of drip sharing a
//     server each call their own; it is loaded on first use, and again
//     when a call finds it missing (a restart without persistence, a
//     FUNCTION FLUSH, a new cluster node).
//   - A script (EVALSHA, then EVAL when the script cache is empty), on
//     servers without functions (before Redis 7, or where ACLs refuse
//     FCALL or FUNCTION LOAD).
var (
	decideBody = "local function init()\n" + bigintLua + "\n" + decideLua + "\nreturn main\nend\n"

	decideScript = rueidis.NewLuaScript(decideBody + "return init()(KEYS, ARGV)\n")

	// libName names both the library and its one function.
	libName = func() string {
		h := sha256.Sum256([]byte(decideBody))
		return "drip_" + hex.EncodeToString(h[:8])
	}()

	// libCode is the library. Library code runs at FUNCTION LOAD with
	// only the redis API in reach (no string, math or struct), so the
	// definitions run on the first call instead and are kept.
	libCode = "#!lua name=" + libName + "\n" + "local main\n" + decideBody +
		"redis.register_function('" + libName + "', function(keys, args)\n" +
		"  if not main then main = init() end\n" +
		"  return main(keys, args)\n" +
		"end)\n"
)

// exec makes one call of the decision code on keys with args.
func (s *Store) exec(ctx context.Context, keys, args []string) rueidis.RedisResult {
	if s.scriptsOnly.Load() {
		return decideScript.Exec(ctx, s.c, keys, args)
	}
	fcall := s.c.B().Fcall().Function(libName).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	r := s.c.Do(ctx, fcall)
	if !missingFunction(r.Error()) {
		return r
	}
	if err := s.loadLibrary(ctx); err != nil {
		if !noFunctions(err) {
			return r
		}
		s.scriptsOnly.Store(true)
		return decideScript.Exec(ctx, s.c, keys, args)
	}
	return s.c.Do(ctx, s.c.B().Fcall().Function(libName).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
}

// loadLibrary loads the library on every node the client knows (a
// replica refuses it, READONLY, and gets it by replication); it fails
// only when no node took it.
func (s *Store) loadLibrary(ctx context.Context) error {
	var first error
	loaded := false
	for _, n := range s.c.Nodes() {
		err := n.Do(ctx, n.B().FunctionLoad().Replace().FunctionCode(libCode).Build()).Error()
		if err == nil {
			loaded = true
		} else if first == nil || noFunctions(err) {
			first = err
		}
	}
	if loaded {
		return nil
	}
	return first
}

// missingFunction reports an FCALL that found no such function (not
// loaded yet, or lost) or no FCALL at all.
func missingFunction(err error) bool {
	if err == nil {
		return false
	}
	return strings.Contains(err.Error(), "Function not found") || noFunctions(err)
}

// noFunctions reports a server that has no functions, or will not let
// this client use them.
func noFunctions(err error) bool {
	if err == nil {
		return false
	}
	m := err.Error()
	return strings.Contains(m, "unknown command") || strings.HasPrefix(m, "NOPERM")
}
