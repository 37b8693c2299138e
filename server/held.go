package server

import (
	"fmt"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/server/envoy"
	"github.com/driplimit/drip/store"
)

// checkHeld refuses rules the store cannot hold (store.Caps): sliding
// windows on a store without them (every store of drip holds them; a
// store of the user's may not) would make every decision
// of the rule an error (answered by its on_error), so a file asking for
// them fails to load, at start as on reload, rather than leave the rule
// unenforced. A leased rule (or Envoy limit, env) on a store without
// blocks of leased tokens would be decided per request, with none of
// what the file asked: refused too.
func (s *Server) checkHeld(set *rules.Set, env *envoy.Config) error {
	c := s.store.Caps()
	for _, r := range set.Rules {
		switch {
		case r.Limit.Algorithm == drip.SlidingWindow && !c.Sliding:
			return fmt.Errorf("rule %q: this store does not hold sliding windows", r.Name)
		case r.Limit.Calendar != "" && !c.Calendar:
			return fmt.Errorf("rule %q: this store does not hold calendar windows", r.Name)
		case r.Limit.Leased && !c.Blocks:
			return fmt.Errorf("rule %q: leased: this store does not hold blocks of leased tokens (the memory, Redis and PostgreSQL stores do)", r.Name)
		}
	}
	return checkEnvoyHeld(env, c)
}

// checkEnvoyHeld refuses an Envoy config with a leased limit on a store
// without blocks, as checkHeld refuses such a rule.
func checkEnvoyHeld(env *envoy.Config, c store.Caps) error {
	if c.Blocks {
		return nil
	}
	for _, l := range env.Limits() {
		if l.Limit.Leased {
			return fmt.Errorf("envoy limit %q: leased: this store does not hold blocks of leased tokens (the memory, Redis and PostgreSQL stores do)", l.Label())
		}
	}
	return nil
}
