package rules

import (
	"math"
	"strconv"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
)

// FuncRule is a rule without a rules file: one enforce limit whose key,
// and maybe cost, a program computes per request (httplimit's key
// functions). Set turns it into a Set the engine decides like any other.
type FuncRule struct {
	// Name of the limit, as a rule's: in bucket keys ("name|key"),
	// headers, problem bodies and metrics. 1 to 128 letters, digits, '-',
	// '_' or '.'.
	Name string
	// Limit is the rule's limit.
	Limit drip.Limit
	// Cost says that the program computes each request's cost: a
	// cost_source of kind KindFunc, default_cost 1. Otherwise every
	// request costs 1, and the burst must be at least 1.
	Cost bool
	// OnError is the fail policy (empty: Allow).
	OnError OnError
	// LocalShare is the share of the rate and burst that the local
	// fallback grants under OnError Local (0: DefaultLocalShare).
	LocalShare float64
}

// Set returns a Set of the one rule, keyed by a source of kind KindFunc.
// The rest takes a rules file's defaults: breaker, jitter, no
// store_timeout. An invalid name, limit, fail policy or share is an
// *Error listing every issue.
func (f FuncRule) Set() (*Set, error) {
	var problems []Issue
	add := func(path, msg string) { problems = append(problems, Issue{Path: path, Message: msg}) }
	if !validName(f.Name) {
		add("name", "must be 1 to 128 letters, digits, '-', '_' or '.', not "+strconv.Quote(f.Name))
	}
	if err := f.Limit.Validate(); err != nil {
		add("limit", err.Error())
	} else if p, err := f.Limit.Params(""); err == nil && !f.Cost && p.Kind != bucket.Concurrency && p.Burst < defaultCost*bucket.Micro {
		add("limit", "the burst must be >= 1, the cost of a request (or compute costs)")
	}
	switch f.OnError {
	case "":
		f.OnError = Allow
	case Allow, Deny, Local:
	default:
		add("on_error", "must be allow, deny or local, not "+strconv.Quote(string(f.OnError)))
	}
	switch {
	case f.LocalShare == 0:
		f.LocalShare = DefaultLocalShare
	case !(f.LocalShare > 0 && f.LocalShare <= 1) || math.IsNaN(f.LocalShare):
		add("local_share", "must be > 0 and <= 1")
	}
	if len(problems) > 0 {
		return nil, &Error{Problems: problems}
	}
	r := Rule{
		Name:        f.Name,
		LimitKeys:   []Source{{Kind: KindFunc}},
		Mode:        Enforce,
		Limit:       f.Limit,
		CostSource:  Source{Kind: KindFixed},
		FixedCost:   defaultCost,
		DefaultCost: defaultCost,
		OnError:     f.OnError,
		LocalShare:  f.LocalShare,
	}
	if f.Cost {
		r.CostSource = Source{Kind: KindFunc}
	}
	return &Set{
		Rules:       []Rule{r},
		IPv6Prefix:  DefaultIPv6Prefix,
		OnError:     f.OnError,
		LocalShare:  f.LocalShare,
		Breaker:     DefaultBreaker,
		RetryJitter: DefaultJitter,
		byName:      map[string]int{f.Name: 0},
	}, nil
}
