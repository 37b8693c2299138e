// Command overload measures limiters that protect an upstream from
// overload, side by side: a stand-in upstream whose latency grows with
// its concurrency past a capacity C, offered open-loop load at several
// multiples of C in mixed priority classes, with C stepping down
// halfway through each run. Each limiter is net/http middleware around
// the same upstream, driven in process by the same generator.
//
//	go run ./overload -c 64 -duration 6s -rounds 3
//
// It is a benchmark: it runs on the wall clock and prints a markdown
// table (progress goes to stderr).
package main

import (
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

type config struct {
	c        int
	base     time.Duration
	duration time.Duration
	timeout  time.Duration
	step     float64
	collapse float64
	shares   []float64
}

// options are the command's flags.
type options struct {
	cfg                          config
	loads, statics, shares, only string
	rounds                       int
	virtual                      bool // in a synctest bubble: no load average to tell
}

func parse(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("overload", flag.ContinueOnError)
	fs.StringVar(&o.loads, "loads", "1,2,5,10", "offered loads, as multiples of C's throughput (C/base per second)")
	fs.StringVar(&o.statics, "statics", "0.25,0.5,0.75,1,1.5,2", "static limits to search, as multiples of C")
	fs.StringVar(&o.shares, "shares", "4,46,30,20", "shares of critical, default, sheddable and batch requests")
	fs.StringVar(&o.only, "only", "", "run only the contenders whose name matches this regexp (the static search always runs)")
	fs.IntVar(&o.rounds, "rounds", 1, "rounds of every run: each row is the median of its rounds")
	fs.IntVar(&o.cfg.c, "c", 64, "the upstream's capacity: requests at once it serves at its base latency")
	fs.DurationVar(&o.cfg.base, "base", 100*time.Millisecond, "the upstream's latency at or below capacity")
	fs.DurationVar(&o.cfg.duration, "duration", 4*time.Second, "each run's length; C steps at half of it")
	fs.DurationVar(&o.cfg.timeout, "timeout", time.Second, "the callers' deadline: a response after it is not served")
	fs.Float64Var(&o.cfg.step, "step", 0.5, "C's multiple after the step")
	fs.Float64Var(&o.cfg.collapse, "collapse", 4, "past this multiple of C in flight the upstream fails")
	err := fs.Parse(args)
	return o, err
}

func main() {
	o, err := parse(os.Args[1:])
	if err != nil {
		os.Exit(2)
	}
	measure(o)
}

// measure runs every round and prints the table.
func measure(o options) {
	cfg, shares, rounds := o.cfg, &o.shares, &o.rounds
	loads, statics := &o.loads, &o.statics
	cfg.shares = floats(*shares)
	filter := regexp.MustCompile(o.only)

	if o.virtual {
		fmt.Printf("in virtual time (testing/synctest): the limiters' CPU and the machine's load take no time\n\n")
	} else {
		fmt.Printf("load average at the start: %s\n\n", loadavg())
		defer func() { fmt.Printf("\nload average at the end: %s\n", loadavg()) }()
	}
	ls := floats(*loads)
	ms := floats(*statics)
	// runs[load][row][round]: row 0.. are the statics, then the contenders.
	runs := make([][][]result, len(ls))
	bestNs := make([][]int, len(ls))
	var unloaded []time.Duration
	for round := range *rounds {
		// The unloaded p99 is measured again each round, the way every
		// run is measured, so that the bound moves with the machine.
		up := &upstream{base: cfg.base, collapse: cfg.collapse}
		up.capacity.Store(int64(cfg.c))
		calib := generate(up, 0.5*float64(cfg.c)/cfg.base.Seconds(), 2*time.Second, cfg.timeout, cfg.shares, func() {})
		u := summarize(calib, 2*time.Second, cfg.timeout).p99
		unloaded = append(unloaded, u)
		slo := 2 * u
		fmt.Fprintf(os.Stderr, "round %d: unloaded p99 %v\n", round+1, u)
		for i, l := range ls {
			rate := l * float64(cfg.c) / cfg.base.Seconds()
			var best result
			bestN := 0
			var rs []result
			for _, m := range ms {
				n := max(1, int(math.Round(m*float64(cfg.c))))
				r := run(static(n), rate, cfg, slo)
				rs = append(rs, r)
				if bestN == 0 || r.goodput > best.goodput {
					best, bestN = r, n
				}
			}
			// The contenders in an order that turns each round, so that
			// none always runs first or after the same one.
			cs := contenders(bestN, cfg.base)
			out := make([]result, len(cs))
			for k := range cs {
				j := (k + round) % len(cs)
				c := cs[j]
				switch {
				case !filter.MatchString(c.name):
					out[j] = result{name: c.name, skipped: true}
				case c.missing != nil:
					fmt.Fprintf(os.Stderr, "%s: not in this build: %v\n", c.name, c.missing)
					out[j] = result{name: c.name, skipped: true}
				default:
					out[j] = run(c, rate, cfg, slo)
				}
			}
			rs = append(rs, out...)
			if runs[i] == nil {
				runs[i] = make([][]result, len(rs))
			}
			for j, r := range rs {
				runs[i][j] = append(runs[i][j], r)
			}
			bestNs[i] = append(bestNs[i], bestN)
		}
	}
	u := medianDuration(unloaded)
	slo := 2 * u
	fmt.Printf("C=%d base=%v duration=%v (C steps to %gxC at %v) timeout=%v shares=%s, %d rounds: unloaded p99 %v (median; each round's goodput counts the responses within 2x its own: %v)\n\n",
		cfg.c, cfg.base, cfg.duration, cfg.step, cfg.duration/2, cfg.timeout, *shares, *rounds, u.Round(time.Millisecond), roundAll(unloaded))
	fmt.Println("| load | limiter | goodput/s | vs best static | served/s | p50 | p99 | critical served | critical worst 0.5 s | failed | settle | adapt | goals missed |")
	fmt.Println("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for i, l := range ls {
		// The best static limit in hindsight: the one of the most
		// goodput, median over the rounds (the best of each round
		// alone would favour the luckiest run).
		bi := 0
		for j := range ms {
			if median(runs[i][j]).goodput > median(runs[i][bi]).goodput {
				bi = j
			}
		}
		best := median(runs[i][bi])
		best.name = fmt.Sprintf("best static (%d)", max(1, int(math.Round(ms[bi]*float64(cfg.c)))))
		fmt.Println(best.row(l, best.goodput, slo))
		for _, rs := range runs[i][len(ms):] {
			r := median(rs)
			if r.skipped {
				continue
			}
			if strings.HasPrefix(r.name, "drip in_flight") {
				r.name += fmt.Sprintf(" (each round's best: %v)", bestNs[i])
			}
			fmt.Println(r.row(l, best.goodput, slo))
		}
	}
}

// contenders are the limiters measured beside the best static limit.
func contenders(bestN int, base time.Duration) []contender {
	return []contender{
		none(),
		dripStatic(bestN),
		dripStaticWait(bestN, base),
		dripAdaptive(0),
		dripAdaptive(base),
		failsafeAdaptive(),
		failsafePriority(),
		goZero(true),
		goZero(false),
		kratosBBR(true),
		kratosBBR(false),
	}
}

func run(c contender, rate float64, cfg config, slo time.Duration) result {
	up := &upstream{base: cfg.base, collapse: cfg.collapse}
	up.capacity.Store(int64(cfg.c))
	h, stop := c.build(up)
	defer stop()
	fmt.Fprintf(os.Stderr, "%-24s %8.0f/s ... ", c.name, rate)
	outs := generate(h, rate, cfg.duration, cfg.timeout, cfg.shares, func() {
		up.capacity.Store(max(1, int64(math.Round(cfg.step*float64(cfg.c)))))
	})
	r := summarize(outs, cfg.duration, slo)
	r.name = c.name
	fmt.Fprintf(os.Stderr, "goodput %.0f/s p99 %v critical %.1f%%\n", r.goodput, r.p99.Round(time.Millisecond), 100*r.critical)
	return r
}

type result struct {
	name          string
	goodput       float64 // served within the SLO, a second
	served        float64 // served within the deadline, a second
	p50, p99      time.Duration
	critical      float64 // share of critical requests served
	criticalWorst float64 // the least of it in a 0.5 s window
	failed        float64 // share of requests that failed or timed out
	settle, adapt time.Duration
	settled       bool // settle is within the first half
	adapted       bool // adapt is within the second half
	skipped       bool // not run
}

// median is the median of each measure of rs, apart (a run that never
// settled or adapted counts as the longest).
func median(rs []result) result {
	m := rs[len(rs)-1]
	if m.skipped {
		return m
	}
	pick := func(f func(r result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		if len(v)%2 == 1 || v[len(v)-1] >= float64(time.Hour) {
			return v[len(v)/2] // of an even count with a "never", the upper one
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	never := float64(time.Hour)
	span := func(d time.Duration, within bool) float64 {
		if !within {
			return never
		}
		return float64(d)
	}
	m.goodput = pick(func(r result) float64 { return r.goodput })
	m.served = pick(func(r result) float64 { return r.served })
	m.p50 = time.Duration(pick(func(r result) float64 { return float64(r.p50) }))
	m.p99 = time.Duration(pick(func(r result) float64 { return float64(r.p99) }))
	m.critical = pick(func(r result) float64 { return r.critical })
	m.criticalWorst = pick(func(r result) float64 { return r.criticalWorst })
	m.failed = pick(func(r result) float64 { return r.failed })
	settle := pick(func(r result) float64 { return span(r.settle, r.settled) })
	adapt := pick(func(r result) float64 { return span(r.adapt, r.adapted) })
	m.settled, m.adapted = settle < never, adapt < never
	m.settle, m.adapt = time.Duration(min(settle, never)), time.Duration(min(adapt, never))
	return m
}

func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// summarize reads a run's outcomes. A request is served when the
// upstream answered 200 within the deadline; it failed when the
// upstream answered 500 or the deadline passed; the rest were rejected
// by the limiter. Goodput counts the requests served within slo. In
// 100 ms windows of arrivals, one is bad when the p99 of what it served
// exceeds slo or more than 1% failed: settle is the end of the last bad
// window of the first half, adapt that of the second, from the step.
func summarize(outs []outcome, d, slo time.Duration) result {
	var r result
	var lat []time.Duration
	var crit, critOK, failed int
	const bin = 100 * time.Millisecond
	nb := int(d/bin) + 1
	binLat := make([][]time.Duration, nb)
	binN, binFail := make([]int, nb), make([]int, nb)
	const win = 500 * time.Millisecond
	nw := int(d/win) + 1
	winCrit, winCritOK := make([]int, nw), make([]int, nw)
	for _, o := range outs {
		b, w := int(o.at/bin), int(o.at/win)
		binN[b]++
		if o.class == 0 {
			crit++
			winCrit[w]++
		}
		switch o.status {
		case http.StatusOK:
			lat = append(lat, o.latency)
			binLat[b] = append(binLat[b], o.latency)
			if o.class == 0 {
				critOK++
				winCritOK[w]++
			}
		case 0, http.StatusInternalServerError:
			failed++
			binFail[b]++
		}
	}
	good := 0
	for _, l := range lat {
		if l <= slo {
			good++
		}
	}
	r.goodput = float64(good) / d.Seconds()
	r.served = float64(len(lat)) / d.Seconds()
	r.p50, r.p99 = quantile(lat, 0.5), quantile(lat, 0.99)
	r.critical = ratio(critOK, crit)
	r.failed = ratio(failed, len(outs))
	r.criticalWorst = 1
	for w := range nw {
		if winCrit[w] >= 5 {
			r.criticalWorst = min(r.criticalWorst, ratio(winCritOK[w], winCrit[w]))
		}
	}
	half := int(d / 2 / bin)
	last := int(d / bin) // bins from here on are partial
	r.settled, r.adapted = true, true
	for b := range last {
		bad := binN[b] > 0 && (quantile(binLat[b], 0.99) > slo || float64(binFail[b]) > 0.01*float64(binN[b]))
		if !bad {
			continue
		}
		end := time.Duration(b+1) * bin
		if b < half {
			r.settle = end
			r.settled = b < half-1
		} else {
			r.adapt = end - d/2
			r.adapted = b < last-1
		}
	}
	return r
}

func (r result) row(load, best float64, slo time.Duration) string {
	var missed []string
	if r.goodput < 0.9*best {
		missed = append(missed, "goodput")
	}
	if load >= 10 && r.critical < 0.99 {
		missed = append(missed, "critical")
	}
	if r.p99 > slo {
		missed = append(missed, "p99")
	}
	if !r.adapted {
		missed = append(missed, "adapt")
	}
	return fmt.Sprintf("| %gx | %s | %.0f | %.0f%% | %.0f | %v | %v | %.1f%% | %.1f%% | %.1f%% | %s | %s | %s |",
		load, r.name, r.goodput, 100*ratio2(r.goodput, best), r.served, ms(r.p50), ms(r.p99),
		100*r.critical, 100*r.criticalWorst, 100*r.failed, span(r.settle, r.settled), span(r.adapt, r.adapted),
		strings.Join(missed, ", "))
}

func span(d time.Duration, within bool) string {
	if !within {
		return "never"
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func ms(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }

func ratio(a, b int) float64 {
	if b == 0 {
		return 1
	}
	return float64(a) / float64(b)
}

func ratio2(a, b float64) float64 {
	if b == 0 {
		return 1
	}
	return a / b
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

func floats(s string) []float64 {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "overload: %q: not a number\n", f)
			os.Exit(2)
		}
		out = append(out, v)
	}
	return out
}

// loadavg is the machine's load average (1, 5 and 15 minutes), as
// /proc/loadavg says; "unknown" elsewhere.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
