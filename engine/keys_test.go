package engine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// keyLog records what a KeyObserver is told.
type keyLog struct {
	mu  sync.Mutex
	got []string
}

func (k *keyLog) Key(rule string, mode rules.Mode, ev engine.Event, it *engine.Item) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.got = append(k.got, fmt.Sprintf("%s %s %s %s %v/%v", rule, mode, ev, it.Key, it.Decision.Tokens, it.Decision.Burst))
}

// TestKeyObserver: WithKeys is told the key of each rule that applied,
// with the event the Observer gets and the bucket's decision.
func TestKeyObserver(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
	  {"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}},
	  {"name": "watch", "mode": "shadow", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 2}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New()
	defer st.Close()
	var log keyLog
	e := engine.New(st, engine.WithKeys(&log))
	defer e.Close()
	if e.Keys() != &log {
		t.Fatal("Keys is not WithKeys's")
	}
	rs := e.Compile(set)
	for range 2 {
		e.Decide(context.Background(), rs, values{"header:x-api-key": "k1"})
	}
	want := []string{
		"per-key enforce allowed per-key|k1 0/1", "watch shadow allowed watch|k1 1/2",
		"per-key enforce denied per-key|k1 0/1", "watch shadow allowed watch|k1 0/2", // peeked
	}
	if fmt.Sprint(log.got) != fmt.Sprint(want) {
		t.Errorf("told\n%q\nwant\n%q", log.got, want)
	}
}
