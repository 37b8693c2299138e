package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

// TestFunctionReload checks that decisions run as a Redis Function, loaded
// on first use and loaded again after FUNCTION FLUSH removed it, with the
// buckets unchanged.
func TestFunctionReload(t *testing.T) {
	r := testserver.StartRedis(t)
	s := open(t, r.URL())
	ctx := context.Background()
	lim := drip.Limit{Rate: 1, Period: time.Hour, Burst: 10}
	take := func(want int64) {
		t.Helper()
		d, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: "k", Limit: lim, Cost: 1})
		if err != nil || !d.Allowed || d.Remaining != want {
			t.Fatalf("take: %+v, %v; want allowed, %d remaining", d, err, want)
		}
	}
	libs := func() string {
		t.Helper()
		out, err := r.Cli("FUNCTION", "LIST")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if l := libs(); strings.Contains(l, "drip_") {
		t.Fatalf("a fresh server lists %q", l)
	}
	take(9)
	if l := libs(); !strings.Contains(l, "drip_") {
		t.Fatalf("after a take, FUNCTION LIST is %q: no drip library", l)
	}
	if _, err := r.Cli("FUNCTION", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	take(8)
	if l := libs(); !strings.Contains(l, "drip_") {
		t.Fatalf("after a flush and a take, FUNCTION LIST is %q: no drip library", l)
	}
}

// TestScriptsWithoutFunctions runs the conformance suite's calls and the
// extremes (runTransport) on a server without functions (FCALL and
// FUNCTION renamed away, as on a server before Redis 7): the store falls
// back to scripts (EVALSHA/EVAL).
func TestScriptsWithoutFunctions(t *testing.T) {
	t.Parallel()
	r := testserver.StartRedis(t, "--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")
	if out, _ := r.Cli("FUNCTION", "LIST"); !strings.Contains(out, "unknown command") {
		t.Fatalf("FUNCTION LIST answered %q", out)
	}
	s := open(t, r.URL())
	runTransport(t, func(t *testing.T) store.Store { return s })
	if out, err := r.Cli("INFO", "commandstats"); err != nil || !strings.Contains(out, "cmdstat_evalsha") {
		t.Fatalf("no EVALSHA in the server's command stats (%v): %s", err, out)
	}
}

// commandCalls is how many times the server ran cmd (INFO commandstats).
func commandCalls(t *testing.T, r *testserver.Redis, cmd string) int {
	t.Helper()
	out, err := r.Cli("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// TestFunctionLoadedOnce checks that callers who find the library missing
// at the same time load it once between them, not once each.
func TestFunctionLoadedOnce(t *testing.T) {
	r := testserver.StartRedis(t)
	s := open(t, r.URL(), redisstore.WithoutBatching())
	ctx := context.Background()
	lim := drip.Limit{Rate: 1, Period: time.Hour, Burst: 100}
	if _, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: "k", Limit: lim, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Cli("FUNCTION", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, r, "function|load")
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: "k" + strconv.Itoa(i), Limit: lim, Cost: 1})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := commandCalls(t, r, "function|load") - before; n != 1 {
		t.Fatalf("64 callers that found the library missing loaded it %d times, want once", n)
	}
}

// TestKeyPermission checks that an ACL refusing a key fails that request
// with the server's NOPERM, and does not make the store give up functions
// for scripts (as an ACL refusing FCALL itself does).
func TestKeyPermission(t *testing.T) {
	r := testserver.StartRedis(t)
	if _, err := r.Cli("ACL", "SETUSER", "app", "on", ">pw", "~drip:ok*", "+@all"); err != nil {
		t.Fatal(err)
	}
	s := open(t, "redis://app:pw@"+r.Addr, redisstore.WithoutBatching())
	ctx := context.Background()
	lim := drip.Limit{Rate: 1, Period: time.Hour, Burst: 10}
	if _, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: "ok1", Limit: lim, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: "bad", Limit: lim, Cost: 1})
	if err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("take on a key the ACL refuses: %v, want NOPERM", err)
	}
	fcalls := commandCalls(t, r, "fcall")
	if _, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: "ok2", Limit: lim, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	if commandCalls(t, r, "fcall") != fcalls+1 || commandCalls(t, r, "evalsha") != 0 {
		t.Fatalf("after a key's NOPERM the store left functions: fcall %d -> %d, evalsha %d",
			fcalls, commandCalls(t, r, "fcall"), commandCalls(t, r, "evalsha"))
	}
}

// TestWithScripts checks that WithScripts runs scripts on a server that
// has functions.
func TestWithScripts(t *testing.T) {
	r := testserver.StartRedis(t)
	s := open(t, r.URL(), redisstore.WithScripts())
	d, err := storetest.Apply(context.Background(), s, bucket.Take, time.Time{}, drip.Request{Key: "k", Limit: drip.PerSecond(10), Cost: 1})
	if err != nil || !d.Allowed {
		t.Fatalf("take: %+v, %v", d, err)
	}
	if commandCalls(t, r, "fcall") != 0 || commandCalls(t, r, "evalsha")+commandCalls(t, r, "eval") == 0 {
		t.Fatalf("fcall %d, evalsha %d, eval %d: want scripts only",
			commandCalls(t, r, "fcall"), commandCalls(t, r, "evalsha"), commandCalls(t, r, "eval"))
	}
}

// TestApplyAfterClose checks that a closed store answers at once, with an
// error, instead of queueing calls that nobody decides.
func TestApplyAfterClose(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t))
	s.Close()
	start := time.Now()
	for range 20 {
		if _, err := storetest.Apply(context.Background(), s, bucket.Take, time.Time{}, drip.Request{Key: "k", Limit: drip.PerSecond(10), Cost: 1}); err == nil {
			t.Fatal("a take on a closed store succeeded")
		}
	}
	// A call queued after the workers stopped waited a second for an
	// answer: 20 such calls take 20 s, a bound no loaded machine reaches.
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("20 takes on a closed store took %v", el)
	}
}

// TestShapeCache drives more distinct shapes (limit and cost) through one
// library than its cache of parsed shapes holds (4096), then earlier ones
// again: every decision is checked against bucket.Eval by the store, and the
// counts here against the limits.
func TestShapeCache(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t), redisstore.WithoutBatching())
	ctx := context.Background()
	tag := randomTag()
	for round := range 2 {
		for i := range 4200 {
			if round == 1 && i%50 != 0 {
				continue
			}
			lim := drip.Limit{Rate: 1, Period: time.Hour, Burst: float64(1000 + i)}
			d, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: "shape:" + tag + ":" + strconv.Itoa(i), Limit: lim, Cost: float64(1 + i%7)})
			if err != nil {
				t.Fatal(err)
			}
			want := int64(1000 + i - (1+i%7)*(round+1))
			if !d.Allowed || d.Remaining != want {
				t.Fatalf("round %d shape %d: %+v, want allowed and %d remaining", round, i, d, want)
			}
		}
	}
}

// TestFunctionsRefused checks that an ACL refusing FCALL makes the store
// run scripts instead.
func TestFunctionsRefused(t *testing.T) {
	r := testserver.StartRedis(t)
	if _, err := r.Cli("ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-fcall"); err != nil {
		t.Fatal(err)
	}
	s := open(t, "redis://app:pw@"+r.Addr)
	for i := range 3 {
		d, err := storetest.Apply(context.Background(), s, bucket.Take, time.Time{}, drip.Request{Key: "k", Limit: drip.Limit{Rate: 1, Period: time.Hour, Burst: 10}, Cost: 1})
		if err != nil || !d.Allowed || d.Remaining != int64(9-i) {
			t.Fatalf("take %d: %+v, %v", i, d, err)
		}
	}
	if commandCalls(t, r, "evalsha")+commandCalls(t, r, "eval") == 0 {
		t.Fatal("no script ran")
	}
}

// TestScriptFailed tells the errors of a script itself (about the call's
// values: the store is up) from the errors a command inside a script
// met, which say the server cannot serve, on a real server.
func TestScriptFailed(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t))
	c := s.Client()
	ctx := context.Background()
	hash := "sf:" + randomTag()
	if err := c.Do(ctx, c.B().Hset().Key(hash).FieldValue().FieldValue("f", "v").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		script string
		want   bool
	}{
		{"return 1 + {}", true},                        // a Lua error, as decide.lua's was on a long slot
		{"return error('drip: not an integer')", true}, // the code's own
		{"return redis.call('INCR', KEYS[1])", false},  // WRONGTYPE from a command
		{"return redis.error_reply('READONLY You can\\'t write against a read only replica.')", false},
		{"return redis.error_reply('OOM command not allowed when used memory > maxmemory.')", false},
	} {
		err := c.Do(ctx, c.B().Eval().Script(tc.script).Numkeys(1).Key(hash).Build()).Error()
		if err == nil {
			t.Fatalf("%s: no error", tc.script)
		}
		if got := redisstore.ScriptFailed(err); got != tc.want {
			t.Errorf("%s: %v: scriptFailed = %v, want %v", tc.script, err, got, tc.want)
		}
	}
	if redisstore.ScriptFailed(context.DeadlineExceeded) {
		t.Error("a deadline is a failed script")
	}
}
