package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/topkeys"
)

// Who is being limited: the server's topkeys.Tracker follows the keys of
// every rule and Envoy limit (Envoy's as "envoy:<label>"), logs denials
// (at most a line per rule a second, each key as its rule's log_key
// says), and answers on the admin listener:
//   GET /v1/admin/top?window=1m|5m|1h[&rule=NAME][&n=N][&scope=fleet|instance]
//                          per rule: the keys with the most requests and
//                          denials (each count with its error), the keys
//                          nearest their limit, totals for rates; of the
//                          fleet (default) or this instance alone
//
// The fleet: when the store keeps a board (store.Board), each instance
// puts its summaries there every topkeys.Interval (never per decision),
// under a name of its own, for topTTL; the fleet's view merges this
// instance's live summaries with every other live instance's latest.
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

// topTTL is how long an instance's summaries stay on the board after it
// last put them: three intervals, so that an instance that stopped drops
// out of the fleet's view within half a minute, and one that missed a put
// or two does not.
const topTTL = 3 * topkeys.Interval

// instanceName is the name an instance puts its summaries under: the
// host's name and a random suffix, apart from every other instance's.
func instanceName() string {
	host, _ := os.Hostname()
	if len(host) > 64 {
		host = host[:64]
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}

// putTop puts the instance's summaries on the board once, at most
// store.MaxBoardBlob bytes of them.
func (s *Server) putTop(ctx context.Context) {
	blob, ok := s.who.Encode(store.MaxBoardBlob)
	if !ok {
		s.log.Warn("drip: the top keys' summaries do not fit on the store's board")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, topkeys.Interval/2)
	defer cancel()
	if err := s.board.PutBoard(ctx, s.instance, blob, s.topTTL); err != nil {
		s.log.Warn("drip: the top keys' summaries were not put on the store's board; the fleet's view misses this instance until they are", "err", err.Error())
	}
}

// top is the admin API's view of the tracker.
type top struct {
	Window string `json:"window"`
	// IntervalSeconds is how long each of the summaries' intervals lasts:
	// the windows move by it.
	IntervalSeconds float64          `json:"interval_seconds"`
	Rules           []topkeys.Window `json:"rules"`
	// Dropped counts decisions not followed by this instance: more rules
	// than the tracker follows at once.
	Dropped int64 `json:"dropped"`
	// Scope is "fleet" (this instance's live view merged with every other
	// live instance's latest summaries on the store's board) or
	// "instance" (this one alone: asked for, or the store keeps no board,
	// or it could not be read: FleetError).
	Scope    string `json:"scope"`
	Instance string `json:"instance"` // this instance's name on the board
	// Instances is how many instances' views are merged, this one's
	// included; StaleSeconds is the age of the oldest summary merged (0:
	// this instance's alone, live). A summary is put every interval and
	// dropped topTTL after its last put.
	Instances    int     `json:"instances"`
	StaleSeconds float64 `json:"stale_seconds"`
	// Unreadable counts the summaries on the board that did not parse
	// (another version of drip), left out.
	Unreadable int    `json:"unreadable,omitempty"`
	FleetError string `json:"fleet_error,omitempty"`
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
	scope := q.Get("scope")
	if scope != "" && scope != "fleet" && scope != "instance" {
		writeError(w, inputf("scope must be fleet or instance"))
		return
	}
	out := top{Window: window, IntervalSeconds: topkeys.Interval.Seconds(), Dropped: s.who.Dropped.Load(), Rules: []topkeys.Window{},
		Scope: "instance", Instance: s.instance, Instances: 1}
	rule := q.Get("rule")
	if scope != "instance" && s.board != nil {
		others, err := s.fleetTop(r.Context(), window, &out)
		if err == nil {
			own, _ := s.who.Windows(window, topkeys.Capacity)
			out.Scope = "fleet"
			for _, v := range topkeys.Merge(n, append(others, own)...) {
				if rule == "" || v.Rule == rule {
					out.Rules = append(out.Rules, v)
				}
			}
			writeJSON(w, http.StatusOK, out)
			return
		}
		out.FleetError = err.Error()
	}
	if rule != "" {
		v, ok := s.who.Rule(rule, window, n)
		if ok {
			out.Rules = append(out.Rules, v)
		}
	} else if all, ok := s.who.Windows(window, n); ok {
		out.Rules = all
	}
	writeJSON(w, http.StatusOK, out)
}

// fleetTop reads the other instances' views over window from the board,
// and counts them and the age of the oldest in out.
func (s *Server) fleetTop(ctx context.Context, window string, out *top) ([][]topkeys.Window, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout*4)
	defer cancel()
	notices, err := s.board.ReadBoard(ctx)
	if err != nil {
		return nil, err
	}
	var parts [][]topkeys.Window
	for _, n := range notices {
		if n.Instance == s.instance {
			continue // this instance's own view is merged live
		}
		var sum topkeys.Summary
		if err := json.Unmarshal(n.Blob, &sum); err != nil {
			out.Unreadable++
			continue
		}
		parts = append(parts, sum.Windows[window])
		out.Instances++
		out.StaleSeconds = max(out.StaleSeconds, n.Age.Seconds())
	}
	return parts, nil
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
