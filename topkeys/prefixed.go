package topkeys

import (
	"sync"
	"sync/atomic"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
)

// Prefixed returns a KeyObserver that follows its rules in t under
// prefix and their name (drip serve's Envoy limits: "envoy:" and the
// limit's name), joining the two once per rule, not per decision.
func (t *Tracker) Prefixed(prefix string) engine.KeyObserver {
	p := &prefixed{t: t, prefix: prefix}
	m := map[string]*ruleStats{}
	p.names.Store(&m)
	return p
}

type prefixed struct {
	t      *Tracker
	prefix string
	mu     sync.Mutex
	names  atomic.Pointer[map[string]*ruleStats] // by the name without prefix
}

func (p *prefixed) Key(rule string, mode rules.Mode, event engine.Event, it *engine.Item) {
	r, ok := (*p.names.Load())[rule]
	if !ok || r.gone.Load() {
		r = p.t.stats(p.prefix + rule)
		if r == nil {
			p.t.Dropped.Add(1)
			return
		}
		p.mu.Lock()
		old := *p.names.Load()
		m := make(map[string]*ruleStats, len(old)+1)
		for k, v := range old {
			if !v.gone.Load() {
				m[k] = v
			}
		}
		m[rule] = r
		p.names.Store(&m)
		p.mu.Unlock()
	}
	p.t.count(r, mode, event, it)
}
