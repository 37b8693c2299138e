package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/seconds"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/simulate"
)

func init() {
	register(command{name: "simulate", brief: "show what a limit does to a traffic pattern, in virtual time", run: runSimulate})
}

const simulateUsage = `usage: drip simulate LIMIT TRAFFIC [OUTPUT]

Runs traffic against a limit on the memory store in virtual time (nothing
sleeps) and prints the accepted and denied requests, the first denial, the
steady state, the longest Retry-After and a row per second.

LIMIT:   --rate N [--period D] [--burst N] [--refill interval]
         [--algorithm fixed_window [--window-start D]] [--max-reserved N]
         [--algorithm sliding_window [--slots N]] (at most rate in any period)
         [--algorithm fixed_window --calendar day|week|month [--time-zone Z]]
         [--from RFC3339] (the instant the run starts: calendar windows follow it)
         or --rules FILE --rule NAME (a rule's limit and fixed cost)
TRAFFIC: --rps N [--for D]       shorthand for --pattern "N/s for D"
         --pattern "60/s for 10s, idle 5s, 100 at once, 10/s for 5s"
         --trace FILE            JSON lines of drip replay ("-": stdin)
         --log FILE              an access log: RFC 3339 or [10/Oct/2000:13:55:36 -0700]
                                 timestamps; --key-field N or --key-regexp RE for a
                                 bucket per client
OUTPUT:  --svg FILE (a chart), --requests N (the first N one by one), --step D

Examples:
  drip simulate --rate 10 --burst 50 --rps 60 --for 10s --svg out.svg
  drip simulate --rules examples/rules.json --rule free --pattern "100 at once, 5/s for 30s"
`

func runSimulate(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("simulate")

	var l drip.Limit
	fs.Float64Var(&l.Rate, "rate", 0, "tokens added per period")
	period := secondsFlag(fs, "period", time.Second, "refill period: a Go duration or seconds")
	fs.Float64Var(&l.Burst, "burst", 0, "bucket capacity (default: rate)")
	refill := fs.String("refill", "continuous", "token bucket refill: continuous or interval")
	algorithm := fs.String("algorithm", "token_bucket", "token_bucket, fixed_window or sliding_window")
	fs.IntVar(&l.Slots, "slots", 0, "sliding window: the slots its period is cut into (default 10)")
	fs.StringVar(&l.Calendar, "calendar", "", "fixed window: a calendar period, day, week or month, instead of --period")
	timeZone := fs.String("time-zone", "", "with --calendar: the time zone of its windows, such as Europe/Berlin (default UTC)")
	fromFlag := fs.String("from", "", "the instant the run starts, RFC 3339 (default: the Unix epoch)")
	windowStart := secondsFlag(fs, "window-start", 0, "fixed window: offset of the window grid from the start of the run (default: derived from the key, as in production)")
	fs.Float64Var(&l.MaxReserved, "max-reserved", 0, "most debt a reservation may run up (default: unbounded)")
	rulesFile := fs.String("rules", "", "a rules file (JSON or YAML) to take the limit from, with --rule")
	ruleName := fs.String("rule", "", "with --rules: the rule whose limit and cost to simulate (default: the file's only rule)")

	rps := fs.Float64("rps", 0, "steady traffic: requests per second")
	forD := secondsFlag(fs, "for", 10*time.Second, "with --rps: how long")
	pattern := fs.String("pattern", "", `traffic pattern: comma-separated phases "R/s for D", "idle D", "N at once"`)
	trace := fs.String("trace", "", "a trace in the JSON-lines format of drip replay (- for stdin); the command's limit, when given, replaces the lines' limits")
	logFile := fs.String("log", "", "an access log (- for stdin), one request per line")
	keyField := fs.Int("key-field", 0, "with --log: the whitespace-separated field (from 1) naming the client")
	keyRegexp := fs.String("key-regexp", "", "with --log: a regexp whose first group names the client")
	cost := fs.Float64("cost", 1, "tokens per request (patterns and logs)")
	reserve := fs.Bool("reserve", false, "requests reserve: they go into debt instead of being denied (patterns and logs)")

	step := secondsFlag(fs, "step", 0, "length of a table row (default 1s, longer for runs over a minute)")
	keep := fs.Int("requests", 0, "also list the first N requests one by one")
	svgFile := fs.String("svg", "", "write a chart of tokens, accepted and denied requests over time to FILE")
	chartKey := fs.String("key", "", "the key whose bucket is charted and tabulated (default: the busiest)")
	if code, done := parseFlags(fs, simulateUsage, args, stdout, stderr); done {
		return code
	}
	fail := func(code int, err error) int {
		fmt.Fprintln(stderr, "drip simulate:", err)
		return code
	}
	if fs.NArg() > 0 {
		return fail(2, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var ruleNote string
	switch {
	case set["rules"] || set["rule"]:
		for _, name := range []string{"rate", "period", "burst", "refill", "algorithm", "window-start", "slots", "calendar", "time-zone"} {
			if set[name] {
				return fail(2, fmt.Errorf("--%s and --rules: the limit comes from one or the other", name))
			}
		}
		r, err := ruleOf(*rulesFile, *ruleName)
		if err != nil {
			return fail(2, err)
		}
		maxReserved := l.MaxReserved
		l = r.Limit
		if set["max-reserved"] {
			l.MaxReserved = maxReserved
		}
		if !set["cost"] {
			*cost = r.FixedCost
			if r.CostSource.Kind != rules.KindFixed {
				*cost = r.DefaultCost // a simulation has no request headers
			}
		}
		ruleNote = fmt.Sprintf("%q of %s", r.Name, *rulesFile)
		if r.Mode == rules.Shadow {
			ruleNote += " (shadow: it never blocks; shown as if enforced)"
		}
	case set["rate"]:
		l.Period = *period
		if l.Calendar != "" {
			if set["period"] {
				return fail(2, fmt.Errorf("--period and --calendar: a calendar window's length is its period's"))
			}
			l.Period = 0
		}
		if set["time-zone"] {
			loc, err := time.LoadLocation(*timeZone)
			if err != nil || *timeZone == "" || *timeZone == "Local" {
				return fail(2, fmt.Errorf("--time-zone %q: not a time zone of the time zone database", *timeZone))
			}
			l.Location = loc
		}
		l.Algorithm = drip.Algorithm(*algorithm)
		if set["refill"] || l.Algorithm == drip.TokenBucket {
			l.Refill = drip.Refill(*refill)
		}
		if set["window-start"] {
			// Virtual time 0 is the Unix epoch, so an offset from the
			// start of the run is one from the epoch; 0 is spelt as a
			// whole period.
			l.Start = *windowStart
			if p := l.Period; p > 0 && l.Start%p == 0 {
				l.Start = p
			}
		}
	}
	haveLimit := set["rate"] || ruleNote != ""
	if haveLimit {
		if err := l.Validate(); err != nil {
			return fail(2, err)
		}
	}

	sources := 0
	for _, name := range []string{"rps", "pattern", "trace", "log"} {
		if set[name] {
			sources++
		}
	}
	if sources != 1 {
		return fail(2, errors.New("give one traffic source: --rps N [--for D], --pattern P, --trace FILE or --log FILE"))
	}
	if !haveLimit && !set["trace"] {
		return fail(2, errors.New("give a limit: --rate N [--period D] [--burst N], or --rules FILE --rule NAME"))
	}

	tmpl := simulate.Arrival{Cost: *cost, Reserve: *reserve}
	var (
		events  []simulate.Arrival
		end     time.Duration
		traffic string
	)
	switch {
	case set["rps"] || set["pattern"]:
		p := *pattern
		if set["rps"] {
			p = fmt.Sprintf("%g/s for %s", *rps, *forD)
		}
		pat, err := simulate.ParsePattern(p)
		if err != nil {
			return fail(2, err)
		}
		events, end = pat.Arrivals(tmpl), pat.Duration()
		traffic = pat.String()
	case set["trace"]:
		err := withInput(*trace, stdin, func(r io.Reader) (err error) {
			events, err = simulate.ReadTrace(r)
			return err
		})
		if err != nil {
			return fail(1, fmt.Errorf("%s: %w", *trace, err))
		}
		if haveLimit {
			for i := range events {
				events[i].Limit = nil
			}
		}
		traffic = "trace " + *trace
	case set["log"]:
		o := simulate.LogOptions{KeyField: *keyField, Cost: *cost}
		if *keyRegexp != "" {
			re, err := regexp.Compile(*keyRegexp)
			if err != nil {
				return fail(2, fmt.Errorf("--key-regexp: %w", err))
			}
			o.KeyPattern = re
		}
		var st simulate.LogStats
		err := withInput(*logFile, stdin, func(r io.Reader) (err error) {
			events, st, err = simulate.ReadLog(r, o)
			return err
		})
		if err != nil {
			return fail(1, fmt.Errorf("%s: %w", *logFile, err))
		}
		for i := range events {
			events[i].Reserve = *reserve
		}
		traffic = fmt.Sprintf("access log %s from %s", *logFile, st.Start.Format(time.RFC3339))
		if st.Skipped > 0 {
			traffic += fmt.Sprintf(" (%d of %d lines skipped: no timestamp)", st.Skipped, st.Lines)
		}
		if st.NoKey > 0 {
			fmt.Fprintf(stderr, "drip simulate: %d lines have no key; they share the bucket \"-\"\n", st.NoKey)
		}
	}

	var from time.Time
	if *fromFlag != "" {
		var err error
		if from, err = time.Parse(time.RFC3339, *fromFlag); err != nil {
			return fail(2, fmt.Errorf("--from: %w", err))
		}
	}
	res, err := simulate.Run(ctx, events, simulate.Options{Limit: l, End: end, Step: *step, ChartKey: *chartKey, Keep: *keep, From: from})
	if err != nil {
		return fail(1, err)
	}
	if ruleNote != "" {
		fmt.Fprintf(stdout, "%-15s %s\n", "rule", ruleNote)
	}
	if err := res.WriteSummary(stdout, traffic); err != nil {
		return fail(1, err)
	}
	if *svgFile != "" {
		f, err := os.Create(*svgFile)
		if err != nil {
			return fail(1, err)
		}
		title := fmt.Sprintf("drip simulate: %s, %s", res.Limit, traffic)
		if ruleNote != "" {
			title = fmt.Sprintf("drip simulate: rule %s, %s", ruleNote, traffic)
		}
		err = res.WriteSVG(f, title)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fail(1, err)
		}
		fmt.Fprintf(stdout, "\nchart written to %s\n", *svgFile)
	}
	return 0
}

// ruleOf loads a rules file and returns the rule called name, or its only
// rule when name is empty.
func ruleOf(file, name string) (*rules.Rule, error) {
	if file == "" {
		return nil, errors.New("--rule needs --rules FILE")
	}
	set, err := rules.Load(file)
	if err != nil {
		return nil, err
	}
	if name == "" && len(set.Rules) == 1 {
		return &set.Rules[0], nil
	}
	if r, ok := set.Rule(name); ok {
		return r, nil
	}
	names := make([]string, len(set.Rules))
	for i, r := range set.Rules {
		names[i] = strconv.Quote(r.Name)
	}
	if name == "" {
		return nil, fmt.Errorf("%s has %d rules: choose one with --rule (%s)", file, len(names), strings.Join(names, ", "))
	}
	return nil, fmt.Errorf("%s has no rule %q; it has %s", file, name, strings.Join(names, ", "))
}

// withInput calls read with the named file, or stdin for "-".
func withInput(name string, stdin io.Reader, read func(io.Reader) error) error {
	if name == "-" {
		return read(stdin)
	}
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	return read(f)
}

// secondsFlag defines a duration flag that reads a Go duration ("1.5s",
// "2m") or a number of seconds, as the rules file and traces do.
func secondsFlag(fs *flag.FlagSet, name string, def time.Duration, usage string) *time.Duration {
	d := def
	if def != 0 {
		usage = fmt.Sprintf("%s (default %v)", usage, def)
	}
	fs.Func(name, usage, func(s string) error {
		v, err := seconds.Parse(s)
		if err != nil {
			return err
		}
		d = v
		return nil
	})
	return &d
}
