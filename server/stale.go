package server

import (
	"sync"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/rules"
)

// staleOverrides are the overrides in force that cannot apply to their
// rule (engine.Stale: set before the rule's algorithm changed). The
// engine never applies them; the server counts them (drip_overrides_stale)
// and logs each once, when it becomes stale, until it is replaced or
// deleted (or the rule changes back).
type staleOverrides struct {
	mu   sync.Mutex
	keys map[string]string // bucket key → the reason
}

// staleCount is how many overrides in force are stale.
func (s *Server) staleCount() int {
	s.stale.mu.Lock()
	defer s.stale.mu.Unlock()
	return len(s.stale.keys)
}

// staleReason says why the override e cannot apply to its rule in set,
// or "" when it can (or its rule is not in force: then it matches no
// request anyway).
func staleReason(set *rules.Set, e override.Entry) string {
	if set == nil {
		return ""
	}
	r, ok := set.Rule(e.Rule)
	if !ok {
		return ""
	}
	return engine.Stale(r, e.Limit)
}

// overridesChanged is the follower's OnChange: snap in the engine, then
// the stale ones among what changed.
func (s *Server) overridesChanged(snap *override.Snapshot) {
	s.eng.SetOverrides(snap)
	keys, all := snap.Changed()
	if all {
		keys = nil
	}
	s.checkStale(snap, all, keys)
}

// checkStale brings the record of stale overrides up to date with the
// rules in force and the overrides of snap: every one (all, after a
// reload of either), or those of keys (a change costs its keys, not every
// override). Overrides that became stale are logged, one line per rule.
func (s *Server) checkStale(snap *override.Snapshot, all bool, keys []string) {
	set := s.rules()
	st := &s.stale
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.keys == nil {
		st.keys = make(map[string]string)
	}
	type group struct{ rule, reason string }
	fresh := make(map[group]int)
	check := func(key string, e override.Entry, ok bool) {
		why := ""
		if ok {
			why = staleReason(set, e)
		}
		if why == "" {
			delete(st.keys, key)
			return
		}
		if st.keys[key] != why {
			fresh[group{e.Rule, why}]++
		}
		st.keys[key] = why
	}
	if all {
		was := st.keys
		st.keys = make(map[string]string, len(was))
		for _, e := range snap.Entries() {
			if why := was[e.Key]; why != "" {
				st.keys[e.Key] = why // logged already, if it still is
			}
			check(e.Key, e, true)
		}
	} else {
		for _, k := range keys {
			e, ok := snap.Entry(k)
			check(k, e, ok)
		}
	}
	for g, n := range fresh {
		s.log.Warn("drip serve: overrides are stale and do not apply; replace or delete them",
			"rule", g.rule, "count", n, "reason", g.reason)
	}
}
