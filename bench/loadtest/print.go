package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

var httpClient = http.Client{Timeout: 5 * time.Second}

func printHeader() {
	fmt.Fprintf(os.Stderr, "loadtest: %s, one line per run as it ends; the tables come at the end\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
}

// print writes the run's line on standard error, as it ends.
func (r *result) print() {
	if r.setupErr != nil {
		fmt.Fprintf(os.Stderr, "loadtest: %s / %s / busy %d: %v\n", r.store, r.name(), r.busy, r.setupErr)
		if r.decisions == 0 {
			return
		}
	}
	fmt.Fprintf(os.Stderr, "loadtest: %s / %s / busy %d: %d decisions, %d errors, %d denied, p50 %s p99 %s, over %s, breaker opens %s\n",
		r.store, r.name(), r.busy, r.decisions, r.errors, r.denied, ms(r.p50), ms(r.p99), r.overText(), r.opensText())
}

func (r *result) name() string {
	if r.fault != nil {
		return r.fault.name + " (" + r.work + ")"
	}
	return r.work
}

func ms(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	switch {
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.0f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

func (r *result) overText() string {
	if r.slots {
		return fmt.Sprintf("%d (max %d of %d)", r.over, r.maxHeld, maxInFlight)
	}
	return fmt.Sprint(r.over)
}

func (r *result) opensText() string {
	if r.opensSampled {
		return fmt.Sprintf("%d*", r.opens)
	}
	return fmt.Sprint(r.opens)
}

func pct(n, of int64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f%%", 100*float64(n)/float64(of))
}

// printDetails writes the tables (markdown) and the error messages of
// every run on standard output.
func printDetails(rs []result) {
	w := os.Stdout
	var work, flt []result
	for _, r := range rs {
		if r.fault != nil {
			flt = append(flt, r)
		} else {
			work = append(work, r)
		}
	}
	if len(work) > 0 {
		fmt.Fprintln(w, "| store | workload | busy loops | clients | decisions | errors | error % | denied | fail-open | p50 | p99 | over-admitted | breaker opens | store errors |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, r := range work {
			fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %s | %d | %.0f | %s | %s | %s | %s | %.0f |\n",
				r.store, r.work, r.busy, r.clients, r.decisions, r.errors, pct(r.errors, r.decisions), r.denied, r.failOpen,
				ms(r.p50), ms(r.p99), r.overText(), r.opensText(), r.storeErrs)
		}
		fmt.Fprintln(w)
	}
	if len(flt) > 0 {
		fmt.Fprintln(w, "| store | fault | busy loops | clients | decisions | errors | error % | p50 | p99 | max | over-admitted | breaker opens | errors before the fault | opened after | first decision after recovery | last error after recovery | errors sent after settling (1 s; failover 2 s) |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, r := range flt {
			fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %s | %s | %s | %s | %s | %s | %d | %s | %s | %s | %d |\n",
				r.store, r.name(), r.busy, r.clients, r.decisions, r.errors, pct(r.errors, r.decisions),
				ms(r.p50), ms(r.p99), ms(r.max), r.overText(), r.opensText(), r.errsBefore, ms(r.openAfter), ms(r.firstOK), ms(r.lastErr), r.errsAfter)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "decisions: answers to the clients (an acquire and its release are one); errors: 5xx answers and failed requests, releases included;")
	fmt.Fprintln(w, "fail-open: decisions drip made without the store (on_error), from its /metrics; breaker opens: from a counter of openings, or (*) the state gauge read every 100 ms (50 ms under a fault)")
	printErrors(w, rs)
}

func printErrors(w io.Writer, rs []result) {
	for _, r := range rs {
		if len(r.errs) == 0 && len(r.warns) == 0 && r.setupErr == nil {
			continue
		}
		fmt.Fprintf(w, "\n%s / %s / busy %d:\n", r.store, r.name(), r.busy)
		if r.setupErr != nil {
			fmt.Fprintf(w, "  run: %v\n", r.setupErr)
		}
		counts(w, "", r.errs)
		counts(w, "drip serve log (at most one store error a second): ", r.warns)
	}
}

// counts writes the 8 commonest messages of c, with their counts.
func counts(w io.Writer, prefix string, c map[string]int64) {
	msgs := make([]string, 0, len(c))
	for m := range c {
		msgs = append(msgs, m)
	}
	slices.SortFunc(msgs, func(a, b string) int { return int(c[b] - c[a]) })
	for i, m := range msgs {
		if i == 8 {
			fmt.Fprintf(w, "  ... %d more messages\n", len(msgs)-i)
			break
		}
		fmt.Fprintf(w, "  %7d  %s%s\n", c[m], prefix, strings.TrimSpace(m))
	}
}
