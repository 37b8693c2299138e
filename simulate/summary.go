package simulate

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store"
)

// WriteSummary writes the run's summary for a terminal: the totals, the
// first denial, the steady state, the longest Retry-After, the first takes
// one by one (Options.Keep) and a row per step. traffic describes the
// traffic (a pattern, a file name); it may be empty.
func (r *Report) WriteSummary(w io.Writer, traffic string) error {
	b := bufio.NewWriter(w)
	p := func(label, format string, args ...any) {
		fmt.Fprintf(b, "%-15s %s\n", label, fmt.Sprintf(format, args...))
	}
	p("limit", "%s", r.Limit)
	if r.Limit.Calendar != "" {
		zone := "UTC"
		if r.Limit.Location != nil {
			zone = r.Limit.Location.String()
		}
		p("windows", "calendar %ss in %s, from local midnight (daylight saving time included)", r.Limit.Calendar, zone)
	} else if r.Limit.Algorithm == drip.FixedWindow {
		period := periodOf(r.Limit)
		start := r.Limit.Start
		if start == 0 {
			start = store.WindowStart(r.ChartKey, period) // as the store places the grid
		}
		start %= period
		p("windows", "open at %.3fs and every %s after (the grid's offset: --window-start)", start.Seconds(), period)
	}
	if traffic != "" {
		p("traffic", "%s", traffic)
	}
	keys := "1 key"
	if r.Keys != 1 {
		keys = fmt.Sprintf("%d keys", r.Keys)
	}
	p("requests", "%d over %ss, %s", r.Total.Sent, secs(r.Total.To), keys)
	if r.Keys > 1 {
		p("tokens of", "%q (the busiest key)", r.ChartKey)
	}
	p("accepted", "%d (%s), %s", r.Total.Accepted, share(r.Total.Accepted, r.Total.Sent), rate(r.Total.AcceptedPerSecond()))
	p("denied", "%d (%s)", r.Total.Denied, share(r.Total.Denied, r.Total.Sent))
	if d := r.FirstDenial; d != nil {
		p("first denial", "request %d at %.3fs%s: %s tokens left, retry after %.3fs (Retry-After: %d)",
			d.N, d.Arrival.At.Seconds(), keyNote(r, d), tok(d.Decision.Tokens), d.Decision.RetryAfter.Seconds(), header(d.Decision.RetryAfter))
	} else {
		p("first denial", "none")
	}
	p("steady state", "%s accepted, %s (from %ss to the end at %ss)",
		share(r.Steady.Accepted, r.Steady.Sent), rate(r.Steady.AcceptedPerSecond()), secs(r.Steady.From), secs(r.Steady.To))
	if d := r.LongestRetry; d != nil {
		p("longest retry", "%.3fs (Retry-After: %d), request %d at %.3fs%s",
			d.Decision.RetryAfter.Seconds(), header(d.Decision.RetryAfter), d.N, d.Arrival.At.Seconds(), keyNote(r, d))
	}
	if d := r.LongestDelay; d != nil {
		p("reserved", "%d allowed in debt; longest wait %.3fs, request %d at %.3fs%s",
			r.Reserved, d.Decision.RetryAfter.Seconds(), d.N, d.Arrival.At.Seconds(), keyNote(r, d))
	}

	if len(r.First) > 0 {
		fmt.Fprintf(b, "\n%6s  %9s  %12s  %s\n", "#", "time", "tokens after", "result")
		for _, o := range r.First {
			res := "accepted"
			switch {
			case !o.Decision.Allowed:
				res = fmt.Sprintf("denied, Retry-After: %d", header(o.Decision.RetryAfter))
			case o.Decision.RetryAfter > 0:
				res = fmt.Sprintf("reserved, runs in %.3fs", o.Decision.RetryAfter.Seconds())
			}
			if r.Keys > 1 {
				res += " (key " + strconv.Quote(o.Arrival.Key) + ")"
			}
			fmt.Fprintf(b, "%6d  %8.3fs  %12s  %s\n", o.N, o.Arrival.At.Seconds(), tok(o.Decision.Tokens), res)
		}
	}

	fmt.Fprintf(b, "\n%-13s  %7s  %8s  %7s  %9s  %s\n", "time (s)", "sent", "accepted", "denied", "accepted%", "tokens at end")
	for _, row := range r.Rows {
		fmt.Fprintf(b, "%-13s  %7d  %8d  %7d  %9s  %s\n",
			secs(row.From)+"-"+secs(row.To), row.Sent, row.Accepted, row.Denied, share(row.Accepted, row.Sent), tok(row.Tokens))
	}
	return b.Flush()
}

// share is n as a percentage of total, or "-" when total is 0.
func share(n, total int) string {
	if total == 0 {
		return "-"
	}
	return strconv.FormatFloat(100*float64(n)/float64(total), 'f', 1, 64) + "%"
}

func keyNote(r *Report, o *Record) string {
	if r.Keys > 1 {
		return fmt.Sprintf(" (key %q)", o.Arrival.Key)
	}
	return ""
}

// header is the Retry-After header value for a wait, before jitter.
func header(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

func secs(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) }

// rate is an accepted rate per second, shown per second from 0.1/s, else
// per hour from 1/h, else per day: a calendar run's 100 a day reads
// "4.2/h", not "0.0/s".
func rate(x float64) string {
	switch {
	case x == 0 || x >= 0.1:
		return strconv.FormatFloat(x, 'f', 1, 64) + "/s"
	case x*3600 >= 1:
		return strconv.FormatFloat(x*3600, 'f', 1, 64) + "/h"
	}
	return strconv.FormatFloat(x*86400, 'f', 1, 64) + "/day"
}

func tok(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }
