package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/testkit/testserver"
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

// noBlocks is a memory store that says, in Caps, that it holds no blocks
// of leased tokens, as PostgreSQL does not.
type noBlocks struct{ *memstore.Store }

func (s noBlocks) Caps() store.Caps {
	c := s.Store.Caps()
	c.Blocks = false
	return c
}

// TestLeasedRefused: a leased rule, or a leased Envoy limit, on a store
// without blocks is refused at start and on reload, naming it; the admin
// API shows which rules are leased.
func TestLeasedRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.json")
	leasedRule := `{"rules": [{"name": "hot", "limit_keys": ["global"], "leased": true, "algorithm_config": {"rps": 5}}]}`
	writeFile(t, path, leasedRule)
	if _, err := New(Config{Rules: path, WatchEvery: -1}, noBlocks{memstore.New()}); err == nil || !strings.Contains(err.Error(), `rule "hot": leased: this store does not hold blocks of leased tokens`) {
		t.Fatalf("New with a leased rule on a store without blocks: err = %v", err)
	}
	srv := start(t, Config{Rules: path, WatchEvery: -1, AdminToken: "T"}, memstore.New())
	if code, out := call(t, "GET", srv.admin+"/v1/admin/rules", "", "Authorization", "Bearer T"); code != 200 || !strings.Contains(out, `"leased":true`) {
		t.Errorf("admin rules: %d %s; want the rule shown leased", code, out)
	}

	writeFile(t, path, `{"rules": [{"name": "api", "limit_keys": ["global"], "algorithm_config": {"rps": 5}}]}`)
	other := start(t, Config{Rules: path, WatchEvery: -1}, noBlocks{memstore.New()})
	writeFile(t, path, leasedRule)
	if err := other.Reload(); err == nil || !strings.Contains(err.Error(), "leased") {
		t.Fatalf("reload of a leased rule on a store without blocks: err = %v", err)
	}

	envoyDir := filepath.Join(dir, "envoy")
	if err := os.MkdirAll(envoyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(envoyDir, "d.yaml"), "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 5, leased: true}}\n")
	if _, err := New(Config{Rules: envoyDir, WatchEvery: -1}, noBlocks{memstore.New()}); err == nil || !strings.Contains(err.Error(), `envoy limit "d.a": leased: this store does not hold blocks`) {
		t.Fatalf("New with a leased Envoy limit on a store without blocks: err = %v", err)
	}
}
