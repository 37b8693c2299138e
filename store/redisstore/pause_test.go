package redisstore_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/stalltest"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

// TestPauseTakesNothing pauses the server (CLIENT PAUSE, for writes and
// for everything) under load from callers with short deadlines: they get
// errors at their deadlines, and once the server runs again it refuses
// every request they sent, so the buckets show nothing taken. With
// batching, at most InFlight calls ever wait at the paused server.
func TestPauseTakesNothing(t *testing.T) {
	for _, batching := range []bool{true, false} {
		for _, pause := range []string{"WRITE", "ALL"} {
			name := "batching/" + pause
			var opts []redisstore.Option
			if !batching {
				name, opts = "without-batching/"+pause, []redisstore.Option{redisstore.WithoutBatching()}
			}
			t.Run(name, func(t *testing.T) {
				srv := testserver.StartRedis(t)
				s := open(t, srv.URL(), opts...)
				keys := []string{"pause:a", "pause:b", "pause:c"}
				// One decision first, so that the store knows the
				// server's clock and the function library is loaded.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if _, err := storetest.Apply(ctx, s, bucket.Peek, time.Time{}, drip.Request{Key: keys[0], Limit: stalltest.Limit}); err != nil {
					t.Fatal(err)
				}
				before := fcalls(t, srv)
				// A pause of writes ends with UNPAUSE; a pause of
				// everything refuses even that, so it ends by itself,
				// well after the load (and a PING waits for it).
				if _, err := srv.Cli("CLIENT", "PAUSE", map[string]string{"WRITE": "600000", "ALL": "4000"}[pause], pause); err != nil {
					t.Fatal(err)
				}
				res := stalltest.Run(t, s, stalltest.Load{
					Callers: 32, Deadline: 100 * time.Millisecond, For: time.Second, Keys: keys,
					// Multi-takes (and those that acquire a slot) wait
					// for a batch as single takes do, under the same
					// bound on calls.
					Multi:   true,
					Leases:  true,
					Running: func() int { return redisstore.Running(s) },
				})
				if pause == "WRITE" {
					if _, err := srv.Cli("CLIENT", "UNPAUSE"); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := srv.Cli("PING"); err != nil {
					t.Fatal(err)
				}
				settle(t, srv)
				sent := fcalls(t, srv) - before
				t.Logf("%v; %d calls reached the server during the pause", res, sent)
				if res.Late > 3*time.Second { // generous, on a loaded machine
					t.Errorf("callers returned up to %v after their deadline", res.Late)
				}
				if batching {
					if res.PeakRunning > redisstore.DefaultBatching.InFlight || sent > int64(redisstore.DefaultBatching.InFlight) {
						t.Errorf("%d batch calls in flight and %d sent during the pause, want at most InFlight (%d)",
							res.PeakRunning, sent, redisstore.DefaultBatching.InFlight)
					}
					if extra := res.PeakGoroutines - res.Goroutines; extra > 3*32 {
						t.Errorf("%d goroutines more during the pause, for 32 callers", extra)
					}
				}
				stalltest.NothingTaken(t, s, keys)
			})
		}
	}
}

var fcallStat = regexp.MustCompile(`cmdstat_(?:fcall|evalsha|eval):calls=(\d+)`)

// fcalls is how many decision calls the server has run.
func fcalls(t *testing.T, srv *testserver.Redis) int64 {
	t.Helper()
	out, err := srv.Cli("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, m := range fcallStat.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseInt(m[1], 10, 64)
		n += v
	}
	return n
}

// settle waits until the server has run every command its clients sent
// (none blocked, no input left unread).
func settle(t *testing.T, srv *testserver.Redis) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		out, err := srv.Cli("CLIENT", "LIST")
		if err != nil {
			t.Fatal(err)
		}
		busy := false
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if strings.Contains(line, "cmd=client|list") {
				continue // this one
			}
			for _, f := range strings.Fields(line) {
				if (strings.HasPrefix(f, "flags=") && strings.Contains(f, "b")) || (strings.HasPrefix(f, "qbuf=") && f != "qbuf=0") {
					busy = true
				}
			}
		}
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("clients still busy 30 s after the pause:\n%s", out)
		}
	}
}
