package redisstore

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/driplimit/drip/internal/spans"
)

// The decision code (bigint.lua, then decide.lua, which defines main) runs
// in one of two forms; no code is ever built from input.
//
//   - A Redis Function (Redis 7 and Valkey), library.lua: loaded with
//     FUNCTION LOAD, called with FCALL. The library keeps its closures
//     between calls, where a script runs all of its definitions (some
//     thirty closures) again on every call: measured on Redis 7.0, that
//     setup was about 17 µs of a lone decision's 35 µs. The library is
//     named after its code's hash, so two versions of drip sharing a
//     server each call their own; it is loaded on first use, and again
//     when a call finds it missing (a restart without persistence, a
//     FUNCTION FLUSH, a new cluster node).
//   - A script, script.lua (EVALSHA, then EVAL when the script cache is
//     empty), on servers without functions (before Redis 7, or where
//     ACLs refuse FCALL or FUNCTION LOAD), or with WithScripts.
var (
	//go:embed library.lua
	libraryLua string
	//go:embed script.lua
	scriptLua string

	code = bigintLua + "\n" + decideLua

	decideScript = rueidis.NewLuaScript(strings.Replace(scriptLua, "{{CODE}}", code, 1))

	// libName names both the library and its one function.
	libName = func() string {
		h := sha256.Sum256([]byte(libraryLua + code))
		return "drip_" + hex.EncodeToString(h[:8])
	}()

	libCode = "#!lua name=" + libName + "\n" +
		strings.NewReplacer("{{CODE}}", code, "{{NAME}}", libName).Replace(libraryLua)
)

// WithScripts makes the store run its code as a script (EVALSHA) even on
// servers with functions: for proxies or Redis-compatible servers that
// answer FCALL in some way the store does not recognise as "no functions".
func WithScripts() Option { return func(s *Store) { s.scriptsOnly.Store(true) } }

// exec makes one call of the decision code on keys with args.
func (s *Store) exec(ctx context.Context, keys, args []string) ([]rueidis.RedisMessage, error) {
	if s.scriptsOnly.Load() {
		return decideScript.Exec(ctx, s.c, keys, args).ToArray()
	}
	fcall := func() ([]rueidis.RedisMessage, error) {
		return s.c.Do(ctx, s.c.B().Fcall().Function(libName).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).ToArray()
	}
	gen := s.loads.Load()
	msgs, err := fcall()
	switch {
	case err == nil || !isRedisError(err):
		return msgs, err
	case noFunctions(err):
		s.scriptsOnly.Store(true)
		return decideScript.Exec(ctx, s.c, keys, args).ToArray()
	case !strings.Contains(err.Error(), "Function not found"):
		return msgs, err
	}
	// The server does not have the library (yet, or any more). FCALL
	// refused the call before running anything, so calling again after
	// loading cannot decide twice.
	spans.Retry(ctx, 1, "function_load")
	if err := s.load(ctx, gen); err != nil {
		if noFunctions(err) {
			s.scriptsOnly.Store(true)
			return decideScript.Exec(ctx, s.c, keys, args).ToArray()
		}
		return nil, fmt.Errorf("loading the function library %s: %w", libName, err)
	}
	return fcall()
}

// load loads the library, once for all the callers that found it missing
// at the same time (a FUNCTION LOAD blocks a server for about a
// millisecond): gen is the count of loads before the caller's FCALL, and
// a load since then made it there too.
func (s *Store) load(ctx context.Context, gen uint64) error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	if s.loads.Load() != gen {
		return nil
	}
	if err := s.loadLibrary(ctx); err != nil {
		return err
	}
	s.loads.Add(1)
	return nil
}

// loadLibrary loads the library on every node the client knows, at once,
// each with a deadline of its own (a replica refuses it, READONLY, and
// gets it by replication); it fails only when no node took it.
func (s *Store) loadLibrary(ctx context.Context) error {
	nodes := s.c.Nodes()
	errs := make(chan error, len(nodes))
	for _, n := range nodes {
		go func() {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			errs <- n.Do(ctx, n.B().FunctionLoad().Replace().FunctionCode(libCode).Build()).Error()
		}()
	}
	var first error
	loaded := false
	for range nodes {
		err := <-errs
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

// isRedisError reports an error answered by the server (as opposed to a
// network or client error).
func isRedisError(err error) bool {
	_, ok := rueidis.IsRedisErr(err)
	return ok
}

// scriptFailed reports an error of the decision code itself, answered
// by the server: a Lua error ("user_function:12: attempt to ...", or
// "user_script:" when run as a script; "ERR Error running script" before
// Redis 7). An error a command inside the code met (OOM, READONLY after
// a failover, LOADING, BUSY) carries its own code first: it says the
// server cannot serve, and is not one.
func scriptFailed(err error) bool {
	if !isRedisError(err) {
		return false
	}
	m := strings.TrimPrefix(err.Error(), "ERR ")
	return strings.HasPrefix(m, "user_function:") || strings.HasPrefix(m, "user_script:") ||
		strings.HasPrefix(m, "Error running script")
}

// noFunctions reports a server that has no functions (FCALL or FUNCTION
// unknown), or will not let this client use them (an ACL refusing the
// command; not one refusing a key, which is the caller's error).
func noFunctions(err error) bool {
	m := err.Error()
	if strings.Contains(m, "unknown command") {
		return true
	}
	return strings.HasPrefix(m, "NOPERM") && (strings.Contains(m, "'fcall'") || strings.Contains(m, "'function"))
}
