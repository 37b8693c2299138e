package server

import (
	"fmt"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/rules"
)

// checkHeld refuses rules the store cannot hold (store.Caps): sliding
// windows on a store without them (every store of drip holds them; a
// store of the user's may not) would make every decision
// of the rule an error (answered by its on_error), so a file asking for
// them fails to load, at start as on reload, rather than leave the rule
// unenforced.
func (s *Server) checkHeld(set *rules.Set) error {
	c := s.store.Caps()
	for _, r := range set.Rules {
		switch {
		case r.Limit.Algorithm == drip.SlidingWindow && !c.Sliding:
			return fmt.Errorf("rule %q: this store does not hold sliding windows", r.Name)
		case r.Limit.Calendar != "" && !c.Calendar:
			return fmt.Errorf("rule %q: this store does not hold calendar windows", r.Name)
		}
	}
	return nil
}
