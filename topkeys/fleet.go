package topkeys

import (
	"cmp"
	"encoding/json"
	"slices"
)

// The fleet's view: instances that share a store each put a Summary of
// their views on the store's board (store.Board) every Interval, and a
// view of the fleet merges them (Merge). Space-Saving summaries of
// apart streams merge as those of successive intervals do (merge): a
// key's counts add up, a summary that does not list it adding its bound
// to its count and its error, so the merged count still overstates the
// fleet's by at most its Error.

// Summary is an instance's views of every rule over each window, as it
// puts them on the board.
type Summary struct {
	Windows map[string][]Window `json:"windows"` // by window: Minute, FiveMinutes, Hour
}

// Summary returns t's views of every rule over each window, each list
// of at most n keys, the bounds raised to what a key left out may have
// been counted.
func (t *Tracker) Summary(n int) Summary {
	s := Summary{Windows: map[string][]Window{}}
	for _, w := range []string{Minute, FiveMinutes, Hour} {
		all, _ := t.Windows(w, Capacity)
		for i := range all {
			all[i].trim(n)
		}
		s.Windows[w] = all
	}
	return s
}

// trim keeps at most n keys in each list of w, raising each bound to the
// count of the first key left out.
func (w *Window) trim(n int) {
	if len(w.TopRequests) > n {
		w.RequestsBound = max(w.RequestsBound, w.TopRequests[n].Count)
		w.TopRequests = w.TopRequests[:n]
	}
	if len(w.TopDenied) > n {
		w.DenialsBound = max(w.DenialsBound, w.TopDenied[n].Count)
		w.TopDenied = w.TopDenied[:n]
	}
	if len(w.Near) > n {
		w.Near = w.Near[:n]
	}
}

// Encode is t's Summary as JSON of at most limit bytes: the lists
// shortened (their bounds raised) until it fits, and then the rules with
// the fewest requests in the minute left out; ok is false when not even
// an empty summary fits.
func (t *Tracker) Encode(limit int) ([]byte, bool) {
	s := t.Summary(Capacity)
	for n := Capacity; ; n /= 2 {
		if n < Capacity {
			for _, ws := range s.Windows {
				for i := range ws {
					ws[i].trim(max(n, 1))
				}
			}
		}
		b, err := json.Marshal(s)
		if err != nil {
			return nil, false
		}
		if len(b) <= limit {
			return b, true
		}
		if n <= 1 {
			break
		}
	}
	// Leave out the rules with the fewest requests in the minute, a
	// quarter at a time.
	busy := map[string]uint64{}
	for _, w := range s.Windows[Minute] {
		busy[w.Rule] = w.Requests
	}
	var names []string
	for _, ws := range s.Windows {
		for _, w := range ws {
			if _, ok := busy[w.Rule]; !ok {
				busy[w.Rule] = 0
			}
		}
	}
	for name := range busy {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int {
		if c := cmp.Compare(busy[b], busy[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	for len(names) > 0 {
		names = names[:len(names)*3/4]
		keep := map[string]bool{}
		for _, n := range names {
			keep[n] = true
		}
		for w, ws := range s.Windows {
			s.Windows[w] = slices.DeleteFunc(ws, func(w Window) bool { return !keep[w.Rule] })
		}
		if b, err := json.Marshal(s); err == nil && len(b) <= limit {
			return b, true
		}
	}
	return nil, false
}

// Merge merges the views of several instances over one window (each
// instance's list of rules), at most n keys in each list, by rule name.
// A rule's counts and totals add up; its Seconds are the longest; a key
// near its limit in several instances' views is listed once, with the
// least left.
func Merge(n int, parts ...[]Window) []Window {
	byRule := map[string][]*Window{}
	for _, p := range parts {
		for i := range p {
			byRule[p[i].Rule] = append(byRule[p[i].Rule], &p[i])
		}
	}
	out := make([]Window, 0, len(byRule))
	for name, ws := range byRule {
		m := Window{Rule: name, Window: ws[0].Window}
		var reqs, dens []*sum
		near := map[string]Near{}
		for _, w := range ws {
			m.Shadow = m.Shadow || w.Shadow
			m.Seconds = max(m.Seconds, w.Seconds)
			m.Requests += w.Requests
			m.Denials += w.Denials
			m.TotalRequests += w.TotalRequests
			m.TotalDenials += w.TotalDenials
			m.Logged += w.Logged
			m.Unlogged += w.Unlogged
			reqs = append(reqs, asSum(w.TopRequests, w.Requests, w.RequestsBound))
			dens = append(dens, asSum(w.TopDenied, w.Denials, w.DenialsBound))
			for _, k := range w.Near {
				if o, ok := near[k.Key]; !ok || k.Left < o.Left {
					near[k.Key] = k
				}
			}
		}
		req, den := merge(reqs...), merge(dens...)
		m.TopRequests, m.RequestsBound = counts(req, n), req.bound
		m.TopDenied, m.DenialsBound = counts(den, n), den.bound
		m.Near = []Near{}
		for _, k := range near {
			m.Near = append(m.Near, k)
		}
		sortNear(m.Near)
		if len(m.Near) > n {
			m.Near = m.Near[:n]
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Window) int { return cmp.Compare(a.Rule, b.Rule) })
	return out
}

// asSum is a list of counts as a summary to merge (keys by their text:
// the instances hash them with seeds of their own).
func asSum(cs []Count, total, bound uint64) *sum {
	s := &sum{total: total, bound: bound}
	for _, c := range cs {
		s.entries = append(s.entries, entry{key: c.Key, cut: c.Cut, count: c.Count, err: c.Error})
	}
	return s
}
