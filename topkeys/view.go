package topkeys

import (
	"cmp"
	"slices"
	"time"
)

// Windows a view covers: Minute (the current interval and the five
// before it: 50 to 60 s), FiveMinutes (the current minute's intervals
// and the four whole minutes before: 4 to 5 min) and Hour (the current
// five minutes' intervals and the eleven whole five minutes before: 55 to
// 60 min). Window.Seconds says how long the view covers.
const (
	Minute      = "1m"
	FiveMinutes = "5m"
	Hour        = "1h"
)

// Count is one key's count in a window: its true count is between
// Count-Error and Count.
type Count struct {
	Key string `json:"key"`
	// Cut reports a key longer than MaxKeyBytes, of which Key is the
	// start.
	Cut   bool   `json:"cut,omitempty"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
}

// Near is a key near its limit: at its latest decision in the last
// minute, Tokens were left of Limit (the burst; for a concurrency limit,
// slots free of max_in_flight), Left of it.
type Near struct {
	Key    string  `json:"key"`
	Cut    bool    `json:"cut,omitempty"`
	Tokens float64 `json:"tokens"`
	Limit  float64 `json:"limit"`
	Left   float64 `json:"left"`
}

// Window is one rule's view over a window.
type Window struct {
	Rule   string `json:"rule"`
	Shadow bool   `json:"shadow,omitempty"`
	Window string `json:"window"`
	// Seconds is how long the window covers (its intervals, up to now).
	Seconds float64 `json:"seconds"`
	// Requests and Denials are the decisions counted in the window.
	Requests uint64 `json:"requests"`
	Denials  uint64 `json:"denials"`
	// TopRequests and TopDenied are the keys with the most requests and
	// denials, most first; a key not listed had at most RequestsBound
	// requests (DenialsBound denials).
	TopRequests   []Count `json:"top_requests"`
	RequestsBound uint64  `json:"requests_bound"`
	TopDenied     []Count `json:"top_denied"`
	DenialsBound  uint64  `json:"denials_bound"`
	// Near are the keys with the least left relative to their limit at
	// their latest decision of the last minute, least first.
	Near []Near `json:"near_limit"`
	// TotalRequests and TotalDenials are counted since the rule's first
	// decision (or since it was last forgotten), for rates.
	TotalRequests uint64 `json:"total_requests"`
	TotalDenials  uint64 `json:"total_denials"`
	// Logged and Unlogged are the lines of the denial log (WithDenialLog)
	// written for the rule and the denials left out, in all.
	Logged   int64 `json:"denials_logged"`
	Unlogged int64 `json:"denials_unlogged"`
}

// Windows returns the view of every rule over window (Minute,
// FiveMinutes or Hour; ok false for another), at most n keys in each
// list, by rule name.
func (t *Tracker) Windows(window string, n int) ([]Window, bool) {
	if !validWindow(window) {
		return nil, false
	}
	now := t.now()
	var out []Window
	for _, r := range *t.rules.Load() {
		out = append(out, r.view(window, n, now))
	}
	slices.SortFunc(out, func(a, b Window) int { return cmp.Compare(a.Rule, b.Rule) })
	return out, true
}

// Rule returns the view of one rule over window; ok false when the rule
// has had no decision followed, or window is not one of the three.
func (t *Tracker) Rule(rule, window string, n int) (Window, bool) {
	r, ok := (*t.rules.Load())[rule]
	if !ok || !validWindow(window) {
		return Window{}, false
	}
	return r.view(window, n, t.now()), true
}

func validWindow(w string) bool { return w == Minute || w == FiveMinutes || w == Hour }

func (r *ruleStats) view(window string, n int, now time.Time) Window {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := Window{Rule: r.name, Shadow: r.shadow.Load(), Window: window}
	cur := r.fine[r.pos].pair()
	var parts []*pair
	switch window {
	case Minute:
		for i := 1; i <= fineSlots; i++ { // oldest first
			parts = append(parts, r.fine[(r.pos+i)%fineSlots].pair())
		}
		parts[len(parts)-1] = cur
	case FiveMinutes:
		for i := range minuteSlots {
			parts = append(parts, r.minutes[(r.mpos+i)%minuteSlots])
		}
		parts = append(parts, r.minAcc, cur)
	case Hour:
		for i := range fiveSlots {
			parts = append(parts, r.fives[(r.fpos+i)%fiveSlots])
		}
		parts = append(parts, r.fiveAcc, r.minAcc, cur)
	}
	var reqs, dens []*sum
	for _, p := range parts {
		if p != nil && !p.req.start.IsZero() {
			reqs, dens = append(reqs, p.req), append(dens, p.den)
		}
	}
	req, den := merge(reqs...), merge(dens...)
	w.Seconds = now.Sub(req.start).Seconds()
	w.Requests, w.Denials = req.total, den.total
	w.TopRequests, w.RequestsBound = counts(req, n), req.bound
	w.TopDenied, w.DenialsBound = counts(den, n), den.bound
	w.Near = r.near(n)
	w.Logged, w.Unlogged = r.log.logged.Load(), r.log.unlogged.Load()
	w.TotalRequests, w.TotalDenials = r.retired[0], r.retired[1]
	for _, s := range r.fine {
		q, d := s.totals()
		w.TotalRequests += q
		w.TotalDenials += d
	}
	return w
}

func counts(s *sum, n int) []Count {
	out := make([]Count, 0, min(n, len(s.entries)))
	for _, e := range s.entries {
		if len(out) == n {
			break
		}
		out = append(out, Count{Key: e.key, Cut: e.cut, Count: e.count, Error: e.err})
	}
	return out
}

// near lists the keys nearest their limit: the current interval's, which
// carries those of the minute before it at their latest decision.
func (r *ruleStats) near(n int) []Near {
	out := []Near{}
	r.fine[r.pos].each(func(sh *shard) {
		for x := range sh.near.n {
			out = append(out, Near{Key: string(sh.near.key[x]), Cut: sh.near.cut[x], Tokens: sh.near.tok[x], Limit: sh.near.lim[x], Left: sh.near.left[x]})
		}
	})
	sortNear(out)
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// sortNear sorts keys least left first.
func sortNear(out []Near) {
	slices.SortStableFunc(out, func(a, b Near) int {
		if c := cmp.Compare(a.Left, b.Left); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
}
