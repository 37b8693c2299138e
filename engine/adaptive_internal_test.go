package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip/rules"
)

// TestAdaptiveExact: however the limit moves (latency, drops) and
// whatever the classes, waits and queue, a slot is only ever taken
// within the capacity of the moment: in flight never exceeds the
// learned limit.
func TestAdaptiveExact(t *testing.T) {
	var over atomic.Int64
	onTake = func(inflight, capacity int) {
		if inflight > capacity {
			over.Add(1)
		}
	}
	defer func() { onTake = nil }()
	synctest.Test(t, func(t *testing.T) {
		cfg := &rules.Adaptive{InitialLimit: 10, MinLimit: 1, MaxLimit: 40, Tolerance: 0.1, Smoothing: 1, Window: 10 * time.Millisecond, DropStatus: rules.DefaultDropStatus}
		a := &adaptive{rule: "r", cfg: cfg, limit: 10}
		rule := &rules.Rule{Reserve: 0.2}
		var wg sync.WaitGroup
		var taken atomic.Int64
		for i := range 64 {
			wg.Go(func() {
				class := []int{rules.PriorityBatch, rules.PrioritySheddable, rules.PriorityDefault, rules.PriorityCritical}[i%4]
				for j := range 200 {
					start, ok, _ := a.acquire(context.Background(), time.Now, class, rule.Share(class), time.Duration(i%3)*5*time.Millisecond, 8)
					if !ok {
						time.Sleep(time.Millisecond)
						continue
					}
					taken.Add(1)
					time.Sleep(time.Duration(1+(i*7+j*3)%20) * time.Millisecond)
					a.release(start, time.Now(), (i+j)%17 == 0, true)
				}
			})
		}
		wg.Wait()
		if n := over.Load(); n != 0 {
			t.Fatalf("%d slots taken beyond the capacity", n)
		}
		if taken.Load() == 0 || a.inflight != 0 || len(a.waiters) != 0 {
			t.Fatalf("taken %d, left in flight %d, waiting %d", taken.Load(), a.inflight, len(a.waiters))
		}
	})
}

// TestAdaptiveQueueByClass: a freed slot goes to the highest class
// waiting, then in arrival order; a full queue sheds its lowest waiter
// for a higher class; a lower class is kept under its share.
func TestAdaptiveQueueByClass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := &rules.Adaptive{InitialLimit: 10, MinLimit: 1, MaxLimit: 10, Tolerance: 0.25, Smoothing: 0.5, Window: time.Second, DropStatus: rules.DefaultDropStatus}
		a := &adaptive{rule: "r", cfg: cfg, limit: 10}
		rule := &rules.Rule{Reserve: 0.1}
		ctx := context.Background()
		// Batch may use 8 of 10 slots, default 9, critical 10.
		var starts []time.Time
		for range 8 {
			at, ok, _ := a.acquire(ctx, time.Now, rules.PriorityBatch, rule.Share(rules.PriorityBatch), 0, 3)
			if !ok {
				t.Fatal("batch refused below its share")
			}
			starts = append(starts, at)
		}
		if _, ok, shed := a.acquire(ctx, time.Now, rules.PriorityBatch, rule.Share(rules.PriorityBatch), 0, 3); ok || !shed {
			t.Fatalf("batch past its share: ok %v shed %v", ok, shed)
		}
		if _, ok, _ := a.acquire(ctx, time.Now, rules.PriorityDefault, rule.Share(rules.PriorityDefault), 0, 3); !ok {
			t.Fatal("default refused below its share")
		}
		if _, ok, _ := a.acquire(ctx, time.Now, rules.PriorityCritical, rule.Share(rules.PriorityCritical), 0, 3); !ok {
			t.Fatal("critical refused below the capacity")
		}
		// Full: three wait (queue of 3), in class order.
		got := make(chan int, 10)
		wait := func(class int) {
			go func() {
				_, ok, _ := a.acquire(ctx, time.Now, class, rule.Share(class), time.Minute, 3)
				if ok {
					got <- class
				} else {
					got <- -1 - class
				}
			}()
			synctest.Wait()
		}
		wait(rules.PriorityBatch)
		wait(rules.PriorityDefault)
		wait(rules.PrioritySheddable)
		wait(rules.PriorityCritical) // the queue is full: batch is shed
		if c := <-got; c != -1-rules.PriorityBatch {
			t.Fatalf("a full queue: got %d, want batch shed", c)
		}
		a.release(starts[0], time.Now(), false, false)
		synctest.Wait()
		if c := <-got; c != rules.PriorityCritical {
			t.Fatalf("first freed slot went to %d, want critical", c)
		}
		a.release(starts[1], time.Now(), false, false) // 9 in flight: default's share is full, sheddable's too
		synctest.Wait()
		select {
		case c := <-got:
			t.Fatalf("a slot past default's share went to %d", c)
		default:
		}
		a.release(starts[2], time.Now(), false, false)
		a.release(starts[3], time.Now(), false, false) // 7 in flight: default may use 9, sheddable 9 too (a reserve of 1.5 slots keeps 1)
		synctest.Wait()
		if c, d := <-got, <-got; c+d != rules.PriorityDefault+rules.PrioritySheddable {
			t.Fatalf("then %d and %d, want default and sheddable", c, d)
		}
	})
}

// TestAdaptiveForgetsIdleKeys: the keys a client makes up do not fill an
// engine's adaptive buckets for good. When the set is full, the buckets
// no request holds, waits for or is about to ask are forgotten, so a new
// key gets a bucket of its own rather than sharing the overflow bucket
// with every later key; a busy bucket is kept, with what it learned.
func TestAdaptiveForgetsIdleKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := &rules.Adaptive{InitialLimit: 2, MinLimit: 1, MaxLimit: 4, Tolerance: 0.25, Smoothing: 0.5, Window: time.Second, DropStatus: rules.DefaultDropStatus}
		rule := &rules.Rule{Name: "r", Adaptive: cfg}
		e := &Engine{}
		ctx := context.Background()
		busy := e.adaptiveOf(rule, "r|busy")
		start, ok, _ := busy.acquire(ctx, time.Now, rules.PriorityDefault, 1, 0, 1)
		busy.pins.Add(-1)
		if !ok {
			t.Fatal("no slot for the first request")
		}
		pinned := e.adaptiveOf(rule, "r|pinned") // found, not yet in acquire
		fill := func(prefix string) {
			for i := 0; len(e.adapt.m) < MaxAdaptiveKeys; i++ {
				e.adaptiveOf(rule, fmt.Sprintf("r|%s-%d", prefix, i)).pins.Add(-1)
			}
		}
		fill("junk")
		a := e.adaptiveOf(rule, "r|new")
		a.pins.Add(-1)
		if e.adapt.m["r|new"] != a {
			t.Fatal("a new key shares the overflow bucket after idle keys filled the set")
		}
		if e.adapt.m["r|busy"] != busy || e.adapt.m["r|pinned"] != pinned {
			t.Fatal("a bucket in use was forgotten")
		}
		if n := len(e.adapt.m); n > 3 {
			t.Fatalf("%d buckets after the sweep, want the 3 in use", n)
		}
		// A set filled again within a second is not read again for each
		// new key: the key shares the overflow bucket until the next sweep.
		fill("again")
		if b := e.adaptiveOf(rule, "r|soon"); e.adapt.m["r|soon"] == b {
			t.Fatal("a second sweep within adaptiveSweep")
		} else {
			b.pins.Add(-1)
		}
		time.Sleep(adaptiveSweep)
		b := e.adaptiveOf(rule, "r|later")
		b.pins.Add(-1)
		if e.adapt.m["r|later"] != b {
			t.Fatal("no sweep after adaptiveSweep")
		}
		busy.release(start, time.Now(), false, true)
		pinned.pins.Add(-1)
	})
}

// TestSlotStatePinsNothing: the decision API's /v1/peek and a release of
// a lease not held (SlotState) ask about a key and hold nothing. Before,
// each asked left its key's bucket pinned for good, so peeks of 10,000
// made-up keys filled the set for good and every new key afterwards
// shared the rule's overflow bucket.
func TestSlotStatePinsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rule, e := adaptiveRule(2, 4), &Engine{}
		busy := e.adaptiveOf(rule, "r|busy")
		start, ok, _ := busy.acquire(context.Background(), time.Now, rules.PriorityDefault, 1, 0, 1)
		busy.pins.Add(-1)
		if !ok {
			t.Fatal("no slot for the first request")
		}
		if d := e.SlotState(rule, "r|busy"); d.Burst != 2 || d.Remaining != 1 {
			t.Fatalf("SlotState of a busy key: %+v, want limit 2, 1 free", d)
		}
		for i := range MaxAdaptiveKeys + 10 {
			if d := e.SlotState(rule, fmt.Sprintf("r|peek-%d", i)); d.Burst != 2 || d.Remaining != 2 {
				t.Fatalf("SlotState of a new key: %+v, want limit 2, 2 free", d)
			}
		}
		for i := 0; len(e.adapt.m) < MaxAdaptiveKeys; i++ { // idle keys, as requests leave them
			e.adaptiveOf(rule, fmt.Sprintf("r|junk-%d", i)).pins.Add(-1)
		}
		time.Sleep(adaptiveSweep)
		a := e.adaptiveOf(rule, "r|new")
		a.pins.Add(-1)
		if e.adapt.m["r|new"] != a {
			t.Fatal("a new key shares the overflow bucket: the keys asked about stay pinned")
		}
		if e.adapt.m["r|busy"] != busy {
			t.Fatal("a busy bucket was forgotten")
		}
		busy.release(start, time.Now(), false, true)
	})
}

// TestAdaptiveQueueByRule: max_queue bounds the waiters of an adaptive
// rule in all its buckets, as rules.md says of every queue, not those of
// each key: a client that makes up keys gets no queue of its own for
// each. A higher class still takes the place of a lower one in its
// bucket when the rule's queue is full.
func TestAdaptiveQueueByRule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rule, e, ctx := adaptiveRule(1, 1), &Engine{}, context.Background()
		type result struct {
			key string
			ok  bool
		}
		got := make(chan result, 10)
		var held []*adaptive
		for _, key := range []string{"r|a", "r|b", "r|c"} {
			b := e.adaptiveOf(rule, key)
			if _, ok, _ := b.acquire(ctx, time.Now, rules.PriorityDefault, 1, 0, 2); !ok {
				t.Fatalf("no slot for the first request of %s", key)
			}
			b.pins.Add(-1)
			held = append(held, b)
		}
		wait := func(key string, class int) {
			b := e.adaptiveOf(rule, key)
			go func() {
				_, ok, _ := b.acquire(ctx, time.Now, class, 1, time.Minute, 2)
				b.pins.Add(-1)
				got <- result{key, ok}
			}()
			synctest.Wait()
		}
		wait("r|a", rules.PriorityDefault)
		wait("r|b", rules.PriorityBatch) // the rule's queue of 2 is full
		wait("r|c", rules.PriorityDefault)
		if r := <-got; r != (result{"r|c", false}) {
			t.Fatalf("a third waiter of the rule, under another key: %+v, want refused at once", r)
		}
		wait("r|b", rules.PriorityCritical) // takes the batch waiter's place
		if r := <-got; r != (result{"r|b", false}) {
			t.Fatalf("%+v, want the batch waiter dropped", r)
		}
		for _, b := range held {
			b.release(time.Now(), time.Now(), false, false)
		}
		for range 2 {
			if r := <-got; !r.ok {
				t.Errorf("a waiter after the releases: %+v, want a slot", r)
			}
		}
		// They all left: the rule's queue has its 2 places again (r|a and
		// r|b are at their limit, held by the waiters served).
		wait("r|a", rules.PriorityDefault)
		wait("r|b", rules.PriorityDefault)
		select {
		case r := <-got:
			t.Fatalf("%+v: a waiter was refused, its places not given back", r)
		default:
		}
		time.Sleep(time.Minute)
		for range 2 {
			<-got
		}
	})
}

// adaptiveRule is an adaptive rule named r, of the initial limit and
// the max limit given (min 1), learning in windows of a second.
func adaptiveRule(initial, most int) *rules.Rule {
	cfg := &rules.Adaptive{InitialLimit: initial, MinLimit: 1, MaxLimit: most, Tolerance: 0.25, Smoothing: 0.5, Window: time.Second, DropStatus: rules.DefaultDropStatus}
	return &rules.Rule{Name: "r", Adaptive: cfg}
}
