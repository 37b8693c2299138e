package rules

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/calendar"
	"github.com/driplimit/drip/store"
)

// One rule: its name, keys, match and limit.

var ruleFields = []string{"name", "group", "limit_keys", "match", "mode", "algorithm", "algorithm_config", "on_error", "local_share", "limit_from_claims", "cost_from_response", "count_status", "leased", "max_wait", "max_queue", "log_key", "budget", "priority", "priority_from", "reserve"}

func (c *checker) rule(p string, v any, s *Set) (Rule, bool) {
	r := Rule{Mode: Enforce, OnError: s.OnError, LocalShare: s.LocalShare}
	f, ok := c.object(p, v)
	if !ok {
		return r, false
	}
	n := len(c.problems)
	if v, fp, ok := f.get("name"); !ok {
		c.add(p+".name", "required")
	} else if name, ok := c.str(fp, v); ok {
		if !validName(name) {
			c.add(fp, "must be 1 to %d letters, digits, '-', '_' or '.', not %q", maxRuleName, name)
		}
		r.Name = name
	}
	if v, fp, ok := f.get("group"); ok {
		if g, ok := c.str(fp, v); ok {
			if g == "" {
				c.add(fp, "must not be empty (leave it out for no group)")
			}
			r.Group = g
		}
	}
	if v, fp, ok := f.get("limit_keys"); !ok {
		c.add(p+".limit_keys", "required (use [\"global\"] for one bucket shared by every request)")
	} else {
		r.LimitKeys = c.limitKeys(fp, v)
	}
	if v, fp, ok := f.get("match"); ok {
		r.Match = c.match(fp, v, s)
	}
	if v, fp, ok := f.get("mode"); ok {
		if m, ok := c.enum(fp, v, "enforce", "shadow"); ok {
			r.Mode = Mode(m)
		}
	}
	v, fp, ownOnError := f.get("on_error")
	if ownOnError {
		if e, ok := c.enum(fp, v, "allow", "deny", "local"); ok {
			r.OnError = OnError(e)
		}
	}
	if v, fp, ok := f.get("local_share"); ok {
		r.LocalShare, _ = c.share(fp, v)
	}
	algo := drip.TokenBucket
	adaptive := false
	if v, fp, ok := f.get("algorithm"); ok {
		if a, ok := c.enum(fp, v, "token_bucket", "fixed_window", "sliding_window", "concurrency", AlgorithmAdaptive); ok {
			algo = drip.Algorithm(a)
			if a == AlgorithmAdaptive {
				algo, adaptive = drip.Concurrency, true
			}
		}
	}
	if adaptive && r.Mode == Shadow {
		c.add(p+".mode", "an adaptive rule is enforced (its limit learns from the requests it lets through)")
	}
	if adaptive && ownOnError {
		c.add(fp, "does not apply to an adaptive rule (its limit is learned and held in each instance: no store to fail)")
	}
	if algo == drip.Concurrency && !ownOnError {
		// A store failure must not let a concurrency rule's slots
		// overflow unless the rule itself asks for it: the file's
		// default on_error is for rate limits.
		r.OnError = Deny
	}
	if v, fp, ok := f.get("algorithm_config"); !ok && adaptive {
		c.adaptiveConfig(&fields{c: c, path: p + ".algorithm_config", o: newObject(), used: map[string]bool{}}, &r) // every default
	} else if !ok {
		c.add(p+".algorithm_config", "required")
	} else {
		if adaptive {
			if f, ok := c.object(fp, v); ok {
				c.adaptiveConfig(f, &r) // adaptive.go
			}
		} else {
			c.algorithmConfig(fp, v, algo, &r)
		}
	}
	if v, fp, ok := f.get("leased"); ok {
		if on, ok := c.boolean(fp, v); ok && on {
			switch algo {
			case drip.Concurrency:
				c.add(fp, "a concurrency rule is not leased: a slot is held by one request at a time (token_bucket and fixed_window rules are)")
			case drip.SlidingWindow:
				c.add(fp, "a sliding_window rule is not leased: its counts are per slot, not tokens to hand out (token_bucket and fixed_window rules are)")
			default:
				r.Limit.Leased = true
			}
		}
	}
	if v, fp, ok := f.get("limit_from_claims"); ok {
		r.Claims = c.claims(fp, v, &r) // claims.go
	}
	if v, fp, ok := f.get("cost_from_response"); ok {
		r.CostFrom = c.costFromResponse(fp, v) // response.go
	}
	if v, fp, ok := f.get("count_status"); ok {
		r.CountStatus = c.countStatus(fp, v)
	}
	if v, fp, ok := f.get("log_key"); ok {
		if k, ok := c.enum(fp, v, LogKeyHash, LogKeyRedact, LogKeyPlain); ok {
			r.LogKey = k
		}
	}
	if v, fp, ok := f.get("budget"); ok {
		if b, ok := c.enum(fp, v, "soft", "strict"); ok {
			r.Budget = Budget(b)
		}
	}
	c.settleRule(p, &r)
	c.waitFields(f, &r)     // wait.go
	c.priorityFields(f, &r) // adaptive.go
	if c.jwtUser == "" && r.usesJWT() {
		c.jwtUser = p
	}
	f.done(ruleFields...)
	return r, len(c.problems) == n
}

func validName(s string) bool {
	if s == "" || len(s) > maxRuleName {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case 'a' <= ch && ch <= 'z', 'A' <= ch && ch <= 'Z', '0' <= ch && ch <= '9', ch == '-', ch == '_', ch == '.':
		default:
			return false
		}
	}
	return true
}

func (c *checker) limitKeys(p string, v any) []Source {
	l, ok := c.list(p, v)
	if !ok {
		return nil
	}
	if len(l) == 0 {
		c.add(p, "must not be empty (use [\"global\"] for one bucket shared by every request)")
		return nil
	}
	var out []Source
	seen := map[Source]int{}
	for i, x := range l {
		ip := index(p, i)
		s, ok := c.str(ip, x)
		if !ok {
			continue
		}
		src, err := parseKeySource(s)
		if err != nil {
			c.add(ip, "%v", err)
			continue
		}
		hashed := src.Hashed
		if src.Kind == KindAPIKey && !hashed {
			c.add(ip, "an API key is never kept in clear: write hash:api_key")
			continue
		}
		if hashed {
			switch src.Kind {
			case KindHeader, KindQuery, KindCookie, KindJWT, KindAPIKey:
				if c.keyUser == "" {
					c.keyUser = ip
				}
			default:
				c.add(ip, "%q: only api_key or a header:, query:, cookie: or jwt: value is hashed", s)
				continue
			}
		}
		if j, dup := seen[src]; dup {
			c.add(ip, "%q repeats %s[%d]", s, p, j)
			continue
		}
		seen[src] = i
		out = append(out, src)
	}
	return out
}

func (c *checker) match(p string, v any, s *Set) []Condition {
	f, ok := c.object(p, v)
	if !ok {
		return nil
	}
	var out []Condition
	seen := map[Source]string{}
	for _, k := range f.o.keys {
		mv, mp, _ := f.get(k)
		src, err := ParseSource(k)
		if err != nil {
			c.add(mp, "%v", err)
			continue
		}
		if src.Kind == KindGlobal {
			c.add(mp, "global cannot be matched: it has no value")
			continue
		}
		if src.Kind == KindAPIKey {
			c.add(mp, "api_key cannot be matched: it is never compared in clear")
			continue
		}
		if other, dup := seen[src]; dup {
			c.add(mp, "matches the same source as %s", other)
			continue
		}
		seen[src] = mp
		cond := Condition{Source: src}
		var vals []any
		if l, ok := mv.([]any); ok {
			if len(l) == 0 {
				c.add(mp, "must not be an empty list")
				continue
			}
			vals = l
		} else {
			vals = []any{mv}
		}
		for i, x := range vals {
			xp := mp
			if _, isList := mv.([]any); isList {
				xp = index(mp, i)
			}
			text, ok := scalarText(x)
			if !ok {
				c.add(xp, "must be a string (or a list of strings), not %s", kindOf(x))
				continue
			}
			text = matchText(src.Kind, text, s)
			pre, isPrefix := strings.CutSuffix(text, "*")
			if src.Kind == KindPath {
				if msg := matchProblem(pre, isPrefix, s.ExactPaths); msg != "" {
					c.add(xp, "%q %s", text, msg)
					continue
				}
			}
			if isPrefix {
				cond.Prefixes = append(cond.Prefixes, pre)
			} else {
				cond.Values = append(cond.Values, text)
			}
		}
		out = append(out, cond)
	}
	return out
}

// matchText is the text a match on a source of kind k compares with the
// request's: a method in upper case and a path folded as the request's
// are (CleanMethod, CleanPath), so that "post" and "/Admin/*" match.
func matchText(k Kind, text string, s *Set) string {
	switch {
	case k == KindMethod:
		return CleanMethod(text)
	case k == KindPath && !s.ExactPaths:
		return FoldPath(text)
	}
	return text
}

// scalarText is the text a match compares: strings as they are, numbers
// and booleans as written (YAML's `tier: 3` matches the claim 3).
func scalarText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return string(x), true
	case bool:
		return strconv.FormatBool(x), true
	}
	return "", false
}

// location loads the time zone name ("Europe/Berlin", "UTC"), which must
// be one of the time zone database's (calendar.LoadZone).
func (c *checker) location(path, name string) *time.Location {
	loc, err := calendar.LoadZone(name)
	if err != nil {
		c.add(path, "%v", err)
		return nil
	}
	return loc
}

// maxSlots is bucket.MaxSlots, the most slots a sliding window has
// (drip.Limit.Validate holds limits to it too).
const maxSlots = 1000

var configFields = []string{"tokens_per_second", "rps", "rate", "period", "time_zone", "burst", "refill", "start", "max_reserved", "slots", "cost_source", "fixed_cost", "default_cost", "min_cost"}

func (c *checker) algorithmConfig(p string, v any, algo drip.Algorithm, r *Rule) {
	f, ok := c.object(p, v)
	if !ok {
		return
	}
	if algo == drip.Concurrency {
		c.concurrencyConfig(f, r)
		return
	}
	n := len(c.problems)
	l := drip.Limit{Algorithm: algo, Period: time.Second}
	var rateName string // the field the rate came from
	rateOK := false
	for _, name := range []string{"tokens_per_second", "rps", "rate"} {
		v, fp, ok := f.get(name)
		if !ok {
			continue
		}
		if rateName != "" {
			c.add(fp, "cannot be combined with %s (set one of tokens_per_second, rps or rate)", rateName)
			continue
		}
		rateName = name
		l.Rate, rateOK = c.amount(fp, v)
	}
	if rateName == "" {
		c.add(p, "one of tokens_per_second, rps or rate (with period) is required")
	}
	if v, fp, ok := f.get("period"); ok {
		switch unit, _ := v.(string); {
		case rateName != "" && rateName != "rate":
			c.add(fp, "applies to rate only (%s is per second)", rateName)
		case unit == "day" || unit == "week" || unit == "month":
			if algo != drip.FixedWindow {
				c.add(fp, "a calendar period (%s) applies to fixed_window only", unit)
			} else {
				l.Calendar, l.Period = unit, 0
			}
		default:
			if d, ok := c.duration(fp, v, false); ok {
				l.Period = d
			}
		}
	}
	if v, fp, ok := f.get("time_zone"); ok {
		if l.Calendar == "" {
			c.add(fp, "applies to a calendar period (\"period\": \"day\", \"week\" or \"month\") only")
		} else if name, ok := c.str(fp, v); ok {
			l.Location = c.location(fp, name)
		}
	}
	burstOK := false
	if v, fp, ok := f.get("burst"); ok && algo == drip.SlidingWindow {
		c.add(fp, "does not apply to sliding_window (at most rate in any window of period)")
	} else if ok {
		if b, ok := c.amount(fp, v); ok {
			// A burst below the rate is a legitimate limit (a bucket that
			// holds less than a second's refill smooths traffic): rps and
			// tokens_per_second accept it like rate + period does.
			l.Burst = b
			burstOK = true
		}
	} else {
		l.Burst = l.Rate
		burstOK = rateOK
	}
	if v, fp, ok := f.get("refill"); ok {
		if algo != drip.TokenBucket {
			c.add(fp, "applies to token_bucket only")
		} else if s, ok := c.enum(fp, v, "continuous", "interval"); ok {
			l.Refill = drip.Refill(s)
		}
	}
	if v, fp, ok := f.get("start"); ok {
		if algo != drip.FixedWindow {
			c.add(fp, "applies to fixed_window only")
		} else if l.Calendar != "" {
			c.add(fp, "does not apply to a calendar period (its windows start at local midnight)")
		} else if d, ok := c.duration(fp, v, true); ok {
			l.Start = d
			if d == 0 {
				l.Start = l.Period // an explicit 0 aligns windows with the epoch
			}
		}
	}
	if v, fp, ok := f.get("max_reserved"); ok {
		if algo == drip.SlidingWindow {
			c.add(fp, "does not apply to sliding_window (it takes no reservations)")
		} else if m, ok := c.amount(fp, v); ok {
			l.MaxReserved = m
		}
	}
	if v, fp, ok := f.get("slots"); ok {
		if algo != drip.SlidingWindow {
			c.add(fp, "applies to sliding_window only")
		} else if n, ok := c.integer(fp, v, 1, maxSlots); ok {
			l.Slots = n
		}
	}
	r.CostSource = Source{Kind: KindFixed}
	r.FixedCost, r.DefaultCost = defaultCost, defaultCost
	if v, fp, ok := f.get("cost_source"); ok {
		if s, ok := c.str(fp, v); ok {
			src, err := ParseSource(s)
			switch {
			case s == "fixed":
			case isLLMName(s):
				r.CostSource = Source{Kind: KindBound, Name: s}
			case err == nil && (src.Kind == KindHeader || src.Kind == KindQuery):
				r.CostSource = src
			default:
				c.add(fp, "must be \"fixed\", \"header:<name>\", \"query:<name>\", \"openai\" or \"anthropic\" (with :input or :output for a part or :money for its price), not %q", s)
			}
		}
	}
	costAt := func(name string, applies bool, why string) float64 {
		v, fp, ok := f.get(name)
		if !ok {
			return defaultCost
		}
		if !applies {
			c.add(fp, "%s", why)
			return defaultCost
		}
		x, ok := c.amount(fp, v)
		if !ok {
			return defaultCost
		}
		if burstOK && x > l.Burst {
			c.add(fp, "must be <= burst (%s)", strconv.FormatFloat(l.Burst, 'g', -1, 64))
		}
		return x
	}
	fixed := r.CostSource.Kind == KindFixed
	r.FixedCost = costAt("fixed_cost", fixed, "applies to cost_source \"fixed\" only")
	r.DefaultCost = costAt("default_cost", !fixed, "applies to a header:, query:, openai or anthropic cost_source only")
	if f.has("min_cost") {
		r.MinCost = costAt("min_cost", true, "")
	}
	if fixed && !f.has("fixed_cost") && burstOK && l.Burst < defaultCost {
		c.add(p+".burst", "must be >= 1, the default fixed_cost (or set a smaller fixed_cost)")
	}
	if !fixed && !f.has("default_cost") && burstOK && l.Burst < defaultCost {
		c.add(p+".burst", "must be >= 1, the default default_cost (or set a smaller default_cost)")
	}
	f.done(configFields...)
	if len(c.problems) == n {
		if err := l.Validate(); err != nil {
			c.add(p, "%v", err)
		}
	}
	r.Limit = l
}

// leaseTTL reads a lease_ttl into dst, when f has one: a duration above
// 0, at most store.MaxLeaseTTL.
func (c *checker) leaseTTL(f *fields, dst *time.Duration) {
	if v, fp, ok := f.get("lease_ttl"); ok {
		if d, ok := c.duration(fp, v, false); ok {
			if d > store.MaxLeaseTTL {
				c.add(fp, "must be at most 24h")
			} else {
				*dst = d
			}
		}
	}
}

// concurrencyConfig reads the algorithm_config of a concurrency rule:
// max_in_flight (required) and lease_ttl (default store.DefaultLeaseTTL).
// Every request holds one slot: such a rule has no cost.
func (c *checker) concurrencyConfig(f *fields, r *Rule) {
	n := len(c.problems)
	l := drip.Limit{Algorithm: drip.Concurrency, LeaseTTL: store.DefaultLeaseTTL}
	if v, fp, ok := f.get("max_in_flight"); !ok {
		c.add(field(f.path, "max_in_flight"), "required for algorithm concurrency")
	} else if m, ok := c.integer(fp, v, 1, store.MaxInFlight); ok {
		l.MaxInFlight = m
	}
	c.leaseTTL(f, &l.LeaseTTL)
	r.CostSource = Source{Kind: KindFixed}
	r.FixedCost, r.DefaultCost = defaultCost, defaultCost
	f.done("max_in_flight", "lease_ttl")
	if len(c.problems) == n {
		if err := l.Validate(); err != nil {
			c.add(f.path, "%v", err)
		}
	}
	r.Limit = l
}
