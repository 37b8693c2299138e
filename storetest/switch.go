package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
)

// switchAlgo is one kind of limit a key may switch to, and the shape of
// the state it keeps (docs/semantics.md, "When a limit changes"): the
// token buckets and the fixed and calendar windows keep a bucket (tokens
// and ts), a sliding window its counts per slot (a number of slots is a
// shape of its own), a concurrency limit its leases.
type switchAlgo struct {
	name  string
	limit drip.Limit
	shape string
	fresh float64 // a fresh key's tokens, or free slots
	cost  float64 // a take's cost (a lease holds one slot whatever it)
}

// switchAlgos are the limits RunSwitch moves a key between. Each holds 10
// an hour (or 3 slots), and every window opens at the instant the test
// decides at (a UTC midnight): a fresh bucket's ts is that instant under
// every one of them, so nothing refills and the expected tokens are plain
// sums.
func switchAlgos() []switchAlgo {
	return []switchAlgo{
		{"token bucket", drip.PerHour(10), "bucket", 10, 3},
		{"interval", drip.Limit{Rate: 10, Period: time.Hour, Refill: drip.Interval}, "bucket", 10, 1},
		{"fixed window", drip.Limit{Algorithm: drip.FixedWindow, Rate: 10, Period: time.Hour, Start: time.Hour}, "bucket", 10, 2},
		{"calendar window", drip.Limit{Algorithm: drip.FixedWindow, Rate: 10, Calendar: "day", Location: time.UTC}, "bucket", 10, 4},
		{"sliding window", drip.Limit{Algorithm: drip.SlidingWindow, Rate: 10, Period: time.Hour}, "sliding 10", 10, 2},
		{"sliding window of 1 slot", drip.Limit{Algorithm: drip.SlidingWindow, Rate: 10, Period: time.Hour, Slots: 1}, "sliding 1", 10, 3},
		{"sliding window of 2 slots", drip.Limit{Algorithm: drip.SlidingWindow, Rate: 10, Period: time.Hour, Slots: 2}, "sliding 2", 10, 1},
		{"concurrency", drip.InFlight(3, time.Minute), "leases", 3, 1},
	}
}

// RunSwitch moves one key between every two kinds of limit, both ways,
// as a rules reload that changes a rule's algorithm does. It takes under
// A, peeks and takes under B, then takes under A again. Each answer is
// held to docs/semantics.md, "When a limit changes". A state of the same
// shape is kept: its tokens carry over. A state of another shape counts
// as none: the key starts afresh, and the next write replaces it. No
// answer is an error. Every take is made alone, then in a multi-take
// beside a key of its own, unless the store splits keys.
func RunSwitch(t *testing.T, newStore NewStore) {
	st := newStore(t)
	c := ctx(t)
	caps := st.Caps()
	var algos []switchAlgo
	for _, a := range switchAlgos() {
		switch {
		case a.limit.Algorithm == drip.SlidingWindow && !caps.Sliding,
			a.limit.Calendar != "" && !caps.Calendar,
			a.limit.Algorithm == drip.Concurrency && !caps.Leases:
			continue
		}
		algos = append(algos, a)
	}
	// A UTC midnight ahead of the real clock: every window above opens at
	// it, and no store's expiry drops a state written at it mid-test.
	at := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	modes := []bool{false}
	if !caps.SplitsKeys {
		modes = append(modes, true)
	}
	lease := 0
	for _, multi := range modes {
		for _, a := range algos {
			for _, b := range algos {
				if a.name == b.name {
					continue
				}
				name := a.name + " to " + b.name
				if multi {
					name += ", in multi-takes"
				}
				t.Run(name, func(t *testing.T) {
					p := prefix()
					k := p + "k"
					// The model: the shape of the key's state and its
					// tokens (for leases, its free slots).
					var shape string
					var tokens float64
					companion := 10.0
					// expect is what a decision under x answers, and for a
					// take, the model's state after it.
					expect := func(x switchAlgo, take bool) (bool, float64) {
						avail := x.fresh
						if shape == x.shape {
							avail = tokens
						}
						cost := x.cost
						if x.shape == "leases" {
							cost = 1 // a new lease each time: it takes a slot
						}
						if avail < cost {
							return false, avail // and nothing is written
						}
						if take {
							shape, tokens = x.shape, avail-cost
						}
						return true, avail - cost
					}
					req := func(x switchAlgo) drip.Request {
						r := drip.Request{Key: k, Limit: x.limit, Cost: x.cost}
						if x.shape == "leases" {
							lease++
							r.Lease, r.Cost = fmt.Sprint("lease", lease), 0
						}
						return r
					}
					check := func(what string, x switchAlgo, op bucket.Op) {
						t.Helper()
						allowed, want := expect(x, op == bucket.Take)
						r := req(x)
						var d drip.Decision
						var err error
						if multi && op == bucket.Take {
							var m drip.Multi
							m, err = drip.Apply(c, st, op, at, r, drip.Request{Key: p + "other", Limit: drip.PerHour(10), Cost: 1})
							if err == nil {
								d = m.Decisions[0]
								// The other key would leave one token
								// less; it does when the whole passes.
								wantOther := companion - 1
								if allowed {
									companion = wantOther
								}
								if m.Allowed != allowed || m.Decisions[1].Tokens != wantOther {
									t.Errorf("%s: multi-take allowed %v, its other key's tokens %v, want allowed %v, %v", what, m.Allowed, m.Decisions[1].Tokens, allowed, wantOther)
								}
							}
						} else {
							d, err = Apply(c, st, op, at, r)
						}
						if err != nil {
							t.Fatalf("%s: %v", what, err)
						}
						if d.Allowed != allowed || d.Tokens != want {
							t.Errorf("%s: allowed %v tokens %v, want allowed %v tokens %v", what, d.Allowed, d.Tokens, allowed, want)
						}
					}
					check("take under "+a.name, a, bucket.Take)
					check("peek under "+b.name, b, bucket.Peek)
					check("take under "+b.name, b, bucket.Take)
					check("take under "+a.name+" again", a, bucket.Take)
				})
			}
		}
	}
}
