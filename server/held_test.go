package server

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// noWindows is a memory store that says, in Caps, that it holds neither
// sliding nor calendar windows, as a store without them would.
type noWindows struct{ *memstore.Store }

func (s noWindows) Caps() store.Caps {
	c := s.Store.Caps()
	c.Sliding, c.Calendar = false, false
	return c
}

const slidingRules = `{"rules": [{"name": "search", "limit_keys": ["header:x-api-key"], "algorithm": "sliding_window",
	"algorithm_config": {"rate": 3, "period": "1m", "slots": 6}}]}`

// TestSlidingWindowServed: a sliding window rule decides through the
// decision API on the memory store (at most 3 in the window), and a store
// without sliding windows refuses the file at start and on reload, naming
// the rule, instead of failing every decision of it.
func TestSlidingWindowServed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, slidingRules)
	srv := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	for i, want := range []bool{true, true, true, false} {
		code, out := post(t, srv.base+"/v1/take", `{"rule": "search", "values": ["k"]}`)
		if d := decision(t, out); code != 200 || d.Allowed != want || d.Burst != 3 {
			t.Fatalf("take %d: %d %s, want allowed %v of 3", i, code, out, want)
		}
	}

	if _, err := New(Config{Rules: path, WatchEvery: -1}, noWindows{memstore.New()}); err == nil || !strings.Contains(err.Error(), `rule "search": this store does not hold sliding windows`) {
		t.Fatalf("New with sliding rules on a store without them: err = %v", err)
	}
	writeFile(t, path, `{"rules": [{"name": "api", "limit_keys": ["global"], "algorithm_config": {"rps": 5}}]}`)
	other := start(t, Config{Rules: path, WatchEvery: -1}, noWindows{memstore.New()})
	writeFile(t, path, slidingRules)
	if err := other.Reload(); err == nil || !strings.Contains(err.Error(), "sliding windows") {
		t.Fatalf("reload of sliding rules on a store without them: err = %v", err)
	}
	if code, out := post(t, other.base+"/v1/take", `{"rule": "api", "values": []}`); code != 200 {
		t.Fatalf("the rules in force after the refused reload: %d %s", code, out)
	}
}

// TestStoresSlidingWindow: every shared store holds sliding windows
// (Caps.Sliding): drip serve loads the sliding rule on it and decides
// through the decision API, at most 3 in the window, under a key of its
// own.
func TestStoresSlidingWindow(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			st := b.shared(t)
			if !st.Caps().Sliding {
				t.Fatalf("%s: Caps.Sliding false", b.name)
			}
			path := filepath.Join(t.TempDir(), "rules.json")
			writeFile(t, path, slidingRules)
			srv := start(t, Config{Rules: path, WatchEvery: -1}, st)
			body := `{"rule": "search", "values": ["` + testserver.Prefix() + `"]}`
			for i, want := range []bool{true, true, true, false} {
				code, out := post(t, srv.base+"/v1/take", body)
				if d := decision(t, out); code != 200 || d.Allowed != want || d.Burst != 3 {
					t.Fatalf("take %d: %d %s, want allowed %v of 3", i, code, out, want)
				}
			}
		})
	}
}
