package topkeys

import (
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
)

// denials is the denial log (WithDenialLog); for now a stub.
type denials struct{}

func (d *denials) denied(r *ruleStats, mode rules.Mode, it *engine.Item) {}
