package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// leased is an answer of /v1/acquire.
type leased struct {
	Allowed bool   `json:"allowed"`
	Lease   string `json:"lease"`
	Shed    string `json:"shed"`
}

func acquire(t *testing.T, url, body string) leased {
	t.Helper()
	code, out := post(t, url+"/v1/acquire", body)
	var a leased
	if err := json.Unmarshal([]byte(out), &a); code != 200 || err != nil {
		t.Fatalf("acquire %s: %d %s", body, code, out)
	}
	return a
}

// TestAPIAdaptive: the decision API serves an adaptive rule's slots as
// it serves a concurrency limit's: /v1/acquire takes one under a lease
// (waiting with "wait", by "priority"), /v1/release gives it back by
// the lease, and a waiter of a higher class gets a freed slot before
// one of a lower class that came first. A take, a multi-take or a bad
// priority is a 400.
func TestAPIAdaptive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"rules": [{"name": "up", "limit_keys": ["global"], "algorithm": "adaptive", "reserve": 0,
	  "algorithm_config": {"initial_limit": 2, "min_limit": 2, "max_limit": 2}}]}`)
	srv := start(t, Config{Rules: path, WatchEvery: -1, MaxWait: 30 * time.Second}, memstore.New())
	rule := `"rule": "up"`
	a, b := acquire(t, srv.base, `{`+rule+`}`), acquire(t, srv.base, `{`+rule+`}`)
	if !a.Allowed || !b.Allowed || a.Lease == "" || a.Lease == b.Lease {
		t.Fatalf("two acquires within the limit of 2: %+v %+v, want both allowed with leases of their own", a, b)
	}
	if c := acquire(t, srv.base, `{`+rule+`}`); c.Allowed || c.Lease != "" {
		t.Errorf("a third acquire without wait: %+v, want denied at once", c)
	}
	got := make(chan leased, 2)
	for _, class := range []string{"batch", "critical"} {
		go func() { got <- acquire(t, srv.base, `{`+rule+`, "wait": "20s", "priority": "`+class+`"}`) }()
		waitFor(t, class+" waits", func() bool {
			st := srv.eng.Adaptive()
			return len(st) == 1 && st[0].Queued == map[string]int{"batch": 1, "critical": 2}[class]
		})
	}
	if code, out := post(t, srv.base+"/v1/release", `{`+rule+`, "lease": "`+a.Lease+`"}`); code != 200 || !decision(t, out).Allowed {
		t.Fatalf("release: %d %s", code, out)
	}
	first := <-got
	if st := srv.eng.Adaptive(); !first.Allowed || st[0].Queued != 1 {
		t.Fatalf("after one release: %+v served and %d waiting, want the critical waiter served and the batch one waiting", first, st[0].Queued)
	}
	// Released twice, or a lease never acquired: changes nothing.
	for _, lease := range []string{a.Lease, "nope"} {
		if code, out := post(t, srv.base+"/v1/release", `{`+rule+`, "lease": "`+lease+`"}`); code != 200 {
			t.Errorf("release of %s: %d %s, want 200", lease, code, out)
		}
	}
	if st := srv.eng.Adaptive(); st[0].InFlight != 2 || st[0].Queued != 1 {
		t.Errorf("after releasing a lease not held: %d in flight, %d waiting; want 2 and 1", st[0].InFlight, st[0].Queued)
	}
	post(t, srv.base+"/v1/release", `{`+rule+`, "lease": "`+b.Lease+`"}`)
	if second := <-got; !second.Allowed {
		t.Errorf("the batch waiter after the second release: %+v, want allowed", second)
	}
	for _, c := range []struct{ path, body, want string }{
		{"/v1/take", `{` + rule + `}`, "/v1/acquire"},
		{"/v1/acquire", `{"requests": [{` + rule + `}]}`, "multi-take"},
		{"/v1/acquire", `{` + rule + `, "priority": "urgent"}`, "priority"},
		{"/v1/acquire", `{` + rule + `, "priority": 101}`, "priority"},
		{"/v1/acquire", `{` + rule + `, "priority": 1.5}`, "priority"},
		{"/v1/acquire", `{` + rule + `, "priority": ""}`, "priority"},
		{"/v1/acquire", `{` + rule + `, "priority": "` + strings.Repeat("9", 100) + `"}`, "priority"},
		{"/v1/acquire", `{` + rule + `, "priority": ["batch"]}`, "priority"},
		{"/v1/release", `{` + rule + `}`, "lease"},
		{"/v1/release", `{` + rule + `, "lease": "` + strings.Repeat("x", 65) + `"}`, "lease"},
		{"/v1/release", `{` + rule + `, "lease": "a b"}`, "lease"},
	} {
		if code, out := post(t, srv.base+c.path, c.body); code != 400 || !strings.Contains(out, c.want) {
			t.Errorf("%s %s: %d %s, want 400 saying %q", c.path, c.body, code, out, c.want)
		}
	}
}

// TestAPIPriorityQueue: a decision API take that waits is queued by its
// "priority": of two takes waiting on a rule of one token per 2 s, the
// critical one that came second gets the first token, the batch one the
// next (its reservation handed on), and no more pass than the limit.
func TestAPIPriorityQueue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"rules": [{"name": "q", "limit_keys": ["global"], "max_wait": "5s", "reserve": 0,
	  "algorithm_config": {"rate": 1, "period": "2s", "burst": 1}}]}`)
	srv := start(t, Config{Rules: path, WatchEvery: -1, MaxWait: 30 * time.Second}, memstore.New())
	if code, out := post(t, srv.base+"/v1/take", `{"rule": "q"}`); code != 200 || !decision(t, out).Allowed {
		t.Fatalf("the burst: %d %s", code, out)
	}
	type answer struct {
		class   string
		allowed bool
	}
	got := make(chan answer, 2)
	for i, class := range []string{"batch", "critical"} {
		go func() {
			_, out := post(t, srv.base+"/v1/take", `{"rule": "q", "wait": "5s", "priority": "`+class+`"}`)
			got <- answer{class, decision(t, out).Allowed}
		}()
		waitFor(t, class+" waits", func() bool { return scrape(t, srv.admin)[`drip_queue_length{rule=q}`] == float64(i+1) })
	}
	first, second := <-got, <-got
	if first != (answer{"critical", true}) || second != (answer{"batch", true}) {
		t.Errorf("served %+v then %+v, want critical then batch, both allowed", first, second)
	}
	if code, out := post(t, srv.base+"/v1/take", `{"rule": "q", "priority": "critical"}`); code != 200 || decision(t, out).Allowed {
		t.Errorf("a take once both reservations passed: %d %s, want denied (the limit is spent)", code, out)
	}
}

// TestHeldSlotExpires: an adaptive slot acquired through the decision
// API and never released is given back once its lease TTL has passed,
// and its lease then releases nothing.
func TestHeldSlotExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, r := adaptiveEngine(t, `{"name": "up", "limit_keys": ["global"], "algorithm": "adaptive"}`)
		key := r.Key(nil)
		slot, _, _ := e.AcquireSlot(t.Context(), r, key, rules.PriorityDefault, 0, 1)
		var h heldSlots
		if slot == nil || !h.add("l", r.Name, key, slot, time.Minute) {
			t.Fatal("no slot held")
		}
		time.Sleep(time.Minute - time.Millisecond)
		synctest.Wait()
		if got := e.Adaptive()[0].InFlight; got != 1 {
			t.Errorf("before its TTL: %d in flight, want 1", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := e.Adaptive()[0].InFlight; got != 0 {
			t.Errorf("after its TTL: %d in flight, want 0", got)
		}
		if h.take("l", r.Name, key) != nil {
			t.Error("the expired lease is still held")
		}
	})
}

// TestAPIPriorityReserve: a take without "wait" keeps a rule's reserve
// by the body's class: with a reserve of 50%, batch may use none of the
// bucket, critical all of it.
func TestAPIPriorityReserve(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"rules": [{"name": "r", "limit_keys": ["global"], "reserve": "50%",
	  "algorithm_config": {"rate": 1, "period": "1h", "burst": 10}}]}`)
	srv := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	for _, c := range []struct {
		class   string
		allowed bool
	}{{"batch", false}, {"critical", true}, {"default", true}} {
		code, out := post(t, srv.base+"/v1/take", `{"rule": "r", "priority": "`+c.class+`"}`)
		if code != 200 || decision(t, out).Allowed != c.allowed {
			t.Errorf("a %s take: %d %s, want allowed %v", c.class, code, out, c.allowed)
		}
	}
	if code, out := post(t, srv.base+"/v1/peek", `{"rule": "r", "cost": 0}`); code != 200 || decision(t, out).Remaining != 8 {
		t.Errorf("the bucket after them: %d %s, want 8 left (the batch take given back)", code, out)
	}
}

// TestAcquireSlotGone: an acquire whose caller has gone takes no slot,
// whether it left before asking or while it waited, just as a slot was
// handed to it. Before, the slot was kept: the decision API held it
// under a lease nobody had, for the 30 s of its TTL, and then learned
// it as a failure (the limit shrank for callers that hung up).
func TestAcquireSlotGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, r := adaptiveEngine(t, `{"name": "up", "limit_keys": ["global"], "algorithm": "adaptive",
		  "algorithm_config": {"initial_limit": 1, "min_limit": 1, "max_limit": 1}}`)
		key := r.Key(nil)
		gone, cancel := context.WithCancel(t.Context())
		cancel()
		if slot, d, _ := e.AcquireSlot(gone, r, key, rules.PriorityDefault, 0, 1); slot != nil || d.Allowed {
			t.Fatalf("an acquire whose caller has gone: %+v, want denied with no slot", d)
		}
		if got := e.Adaptive()[0].InFlight; got != 0 {
			t.Fatalf("after an acquire whose caller has gone: %d in flight, want 0", got)
		}
		held, _, _ := e.AcquireSlot(t.Context(), r, key, rules.PriorityDefault, 0, 1)
		if held == nil {
			t.Fatal("no slot for the first acquire")
		}
		leaving, leave := context.WithCancel(t.Context())
		got := make(chan *engine.Slot)
		go func() {
			slot, _, _ := e.AcquireSlot(leaving, r, key, rules.PriorityDefault, time.Minute, 1)
			got <- slot
		}()
		synctest.Wait()
		held.Release(false) // the slot goes to the waiter, which leaves at once
		leave()
		if slot := <-got; slot != nil {
			t.Error("a waiter that left as it was handed a slot kept it")
			slot.Release(false)
		}
		if got := e.Adaptive()[0].InFlight; got != 0 {
			t.Errorf("after the waiter left: %d in flight, want 0", got)
		}
	})
}

// adaptiveEngine is an engine on the memory store, closed when the test
// ends, and the rule "up" of rule (JSON), which it parses.
func adaptiveEngine(t *testing.T, rule string) (*engine.Engine, *rules.Rule) {
	t.Helper()
	ms := memstore.New(memstore.WithSweep(0))
	t.Cleanup(func() { ms.Close() })
	e := engine.New(ms, engine.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { e.Close() })
	set, err := rules.Parse([]byte(`{"rules": [`+rule+`]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	r, ok := set.Rule("up")
	if !ok {
		t.Fatal("no rule up")
	}
	return e, r
}
