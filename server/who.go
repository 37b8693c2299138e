package server

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/topkeys"
)

// Who is being limited: the server's topkeys.Tracker follows the keys of
// every rule and Envoy limit (Envoy's as "envoy:<label>"), logs denials
// (at most a line per rule a second, each key as its rule's log_key
// says), and answers on the admin listener:
//   GET /v1/admin/top?window=1m|5m|1h[&rule=NAME][&n=N]
//                          per rule: the keys with the most requests and
//                          denials (each count with its error), the keys
//                          nearest their limit, totals for rates
//   POST /v1/admin/tenant  a tenant's whole picture (tenant.go)
//   GET /ui/               the page (ui.go)

// maxTop bounds the keys of each list an answer holds.
const maxTop = topkeys.Capacity

func (s *Server) newTracker() *topkeys.Tracker {
	return topkeys.New(topkeys.WithDenialLog(topkeys.DenialLog{
		Logger: s.log,
		Keys: func(rule string) string {
			if r, ok := s.rules().Rule(rule); ok {
				return r.LogKey
			}
			return topkeys.KeysHash
		},
	}))
}

// top is the admin API's view of the tracker.
type top struct {
	Window string `json:"window"`
	// IntervalSeconds is how long each of the summaries' intervals lasts:
	// the windows move by it.
	IntervalSeconds float64          `json:"interval_seconds"`
	Rules           []topkeys.Window `json:"rules"`
	// Dropped counts decisions not followed: more rules than the tracker
	// follows at once.
	Dropped int64 `json:"dropped"`
}

func (s *Server) adminTop(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	window := q.Get("window")
	if window == "" {
		window = topkeys.Minute
	}
	n := 10
	if v := q.Get("n"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > maxTop {
			writeError(w, inputf("n must be a whole number from 1 to %d", maxTop))
			return
		}
	}
	if window != topkeys.Minute && window != topkeys.FiveMinutes && window != topkeys.Hour {
		writeError(w, inputf("window must be 1m, 5m or 1h"))
		return
	}
	out := top{Window: window, IntervalSeconds: topkeys.Interval.Seconds(), Dropped: s.who.Dropped.Load(), Rules: []topkeys.Window{}}
	if rule := q.Get("rule"); rule != "" {
		v, ok := s.who.Rule(rule, window, n)
		if ok {
			out.Rules = append(out.Rules, v)
		}
	} else if all, ok := s.who.Windows(window, n); ok {
		out.Rules = all
	}
	writeJSON(w, http.StatusOK, out)
}

// whoCollector exports the denial log's counts per rule at each scrape
// (for the rules followed then: no series outlives its rule's summaries).
type whoCollector struct{ t *topkeys.Tracker }

var (
	denialLines = prometheus.NewDesc("drip_denial_log_lines_total",
		"Lines of the denial log written, by rule (at most one a second per rule).", []string{"rule"}, nil)
	denialUnlogged = prometheus.NewDesc("drip_denial_log_unlogged_total",
		"Denials left out of the denial log (a line was written for the rule less than a second before), by rule.", []string{"rule"}, nil)
	topDropped = prometheus.NewDesc("drip_topkeys_dropped_total",
		"Decisions whose keys were not followed, because the tracker followed as many rules as it can.", nil, nil)
)

func (c whoCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- denialLines
	ch <- denialUnlogged
	ch <- topDropped
}

func (c whoCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.t.Logs() {
		ch <- prometheus.MustNewConstMetric(denialLines, prometheus.CounterValue, float64(l.Logged), l.Rule)
		ch <- prometheus.MustNewConstMetric(denialUnlogged, prometheus.CounterValue, float64(l.Unlogged), l.Rule)
	}
	ch <- prometheus.MustNewConstMetric(topDropped, prometheus.CounterValue, float64(c.t.Dropped.Load()))
}

var _ engine.KeyObserver = (*topkeys.Tracker)(nil)
