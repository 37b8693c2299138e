// Command loadtest holds drip serve to a load on real stores and counts
// what it answers: decisions, errors (by message), denials,
// over-admission, decision latency and circuit breaker openings; with busy
// loops on the same cores if asked, and with store faults (a paused Redis,
// a locked PostgreSQL table, a killed server).
//
//	cd bench && go run ./loadtest -stores postgres,redis -busy 0,4 -duration 30s
//	cd bench && go run ./loadtest -workloads none -faults all -busy 0
//
// Each run starts its own drip serve (built from this repository, its
// defaults, a rules file with a token bucket on a hot key, one on many
// keys, and an in-flight limit), against servers internal/testserver
// starts: PostgreSQL, PgBouncer (transaction mode), Redis, Redis Cluster.
// The clients call the decision API (/v1/take, /v1/acquire then
// /v1/release) or the gateway, in front of an upstream the harness runs.
//
// Over-admission: a bucket of rate r and burst b grants a key at most
// b + r*T over a run of T seconds (counted from the allowed answers of the
// decision API, or the requests that reached the upstream through the
// gateway); an in-flight rule never has more than max_in_flight slots of a
// key held at once (counted by the harness between an allowed acquire and
// its release, or by the upstream while it holds a request).
//
// Breaker openings: a counter of openings in drip serve's /metrics if it
// has one; else the more of the breaker's turns to open in drip serve's
// log and in the drip_store_circuit_state gauge read every 100 ms (50 ms
// in a fault run).
//
// Everything runs on loopback; every loop stops by itself after the
// run's duration; every process it starts is killed when it exits, on
// Ctrl-C too, and by the kernel if the harness dies (Pdeathsig).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type config struct {
	stores        []string
	workloads     []workload
	faults        []fault
	busy          []int
	clients       int
	faultClients  int
	faultRepeat   int
	faultWorkload workload
	duration      time.Duration
	keys          int
	hold          time.Duration
	serveArgs     []string
	drip          string
	dir           string
}

// fault is a store fault made 2 s into a run.
type fault struct {
	name   string
	kind   string // pause, lock, kill, failover
	d      time.Duration
	run    time.Duration // the run's length
	stores []string      // where it applies
	settle time.Duration // after the store is back, errors counted apart
}

var faults = []fault{
	{"pause-300ms", "pause", 300 * time.Millisecond, 8 * time.Second, []string{"redis", "cluster"}, time.Second},
	{"lock-300ms", "lock", 300 * time.Millisecond, 8 * time.Second, []string{"postgres", "pgbouncer"}, time.Second},
	{"pause-5s", "pause", 5 * time.Second, 12 * time.Second, []string{"redis", "cluster"}, time.Second},
	{"lock-5s", "lock", 5 * time.Second, 12 * time.Second, []string{"postgres", "pgbouncer"}, time.Second},
	{"kill-3s", "kill", 3 * time.Second, 12 * time.Second, []string{"postgres", "redis"}, time.Second},
	// A primary killed, its standby promoted; drip serve has both in a
	// multi-host URL (target_session_attrs=read-write). 30 s after, to
	// see any later stretch of refusals. Each run has a pair of its own.
	{"failover", "failover", 0, 32 * time.Second, []string{"postgres", "sentinel"}, 2 * time.Second},
}

// faultAt is when a fault starts, from the start of its run.
const faultAt = 2 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C ends the harness at once (its children go with it)
	}()
	os.Exit(run(ctx, os.Args[1:]))
}

func run(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	stores := fs.String("stores", strings.Join(storeNames, ","), "stores to run on: "+strings.Join(storeNames, ", "))
	works := fs.String("workloads", "all", "workloads: all, none, or a list of api-hot, api-many, api-slots, gw-hot, gw-many, gw-slots")
	flts := fs.String("faults", "none", "fault runs: all, none, or a list of pause-300ms, lock-300ms, pause-5s, lock-5s, kill-3s, failover (each on the stores it applies to)")
	busy := fs.String("busy", "4", "busy loops beside each run (while :; do :; done), a list to run each: 0,4")
	var c config
	fs.IntVar(&c.clients, "clients", 48, "concurrent clients of a workload run")
	fs.DurationVar(&c.duration, "duration", 30*time.Second, "length of a workload run")
	fs.IntVar(&c.keys, "keys", 10_000, "keys of the many-keys workloads")
	fs.DurationVar(&c.hold, "hold", 2*time.Millisecond, "how long a slot of the in-flight rule is held")
	fs.IntVar(&c.faultClients, "fault-clients", 8, "concurrent clients of a fault run")
	fs.IntVar(&c.faultRepeat, "fault-repeat", 1, "runs of each fault")
	fw := fs.String("fault-workload", "api-hot", "the workload of the fault runs")
	serveArgs := fs.String("serve-args", "", "more flags for drip serve, space separated (--store-timeout=500ms)")
	fs.StringVar(&c.drip, "drip", "", "the drip binary (default: built from this repository)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var err error
	if c.stores, err = pick(*stores, storeNames, func(s string) string { return s }); err != nil {
		return usage(err)
	}
	if c.workloads, err = pick(*works, workloads, func(w workload) string { return w.name }); err != nil {
		return usage(err)
	}
	if c.faults, err = pick(*flts, faults, func(f fault) string { return f.name }); err != nil {
		return usage(err)
	}
	fws, err := pick(*fw, workloads, func(w workload) string { return w.name })
	if err != nil || len(fws) != 1 {
		return usage(fmt.Errorf("-fault-workload: one workload"))
	}
	c.faultWorkload = fws[0]
	for f := range strings.SplitSeq(*busy, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n > 64 {
			return usage(fmt.Errorf("-busy %q: whole numbers from 0 to 64", *busy))
		}
		c.busy = append(c.busy, n)
	}
	switch {
	case c.clients < 1 || c.clients > 1000, c.faultClients < 1 || c.faultClients > 1000:
		return usage(fmt.Errorf("clients: 1 to 1000"))
	case c.faultRepeat < 1 || c.faultRepeat > 100:
		return usage(fmt.Errorf("-fault-repeat: 1 to 100"))
	case c.duration <= 0 || c.duration > 10*time.Minute:
		return usage(fmt.Errorf("-duration: above 0, at most 10m"))
	case c.keys < 1 || c.keys > 1_000_000:
		return usage(fmt.Errorf("-keys: 1 to 1,000,000"))
	case c.hold < 0 || c.hold > time.Second:
		return usage(fmt.Errorf("-hold: 0 to 1s"))
	}
	c.serveArgs = strings.Fields(*serveArgs)

	if c.dir, err = os.MkdirTemp("", "drip-load-"); err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		return 1
	}
	defer os.RemoveAll(c.dir)
	if c.drip == "" {
		fmt.Fprintln(os.Stderr, "loadtest: building drip")
		if c.drip, err = buildDrip(ctx, c.dir); err != nil {
			fmt.Fprintln(os.Stderr, "loadtest:", err)
			return 1
		}
	}
	rulesFile := c.dir + "/rules.json"
	if err := os.WriteFile(rulesFile, []byte(rulesJSON), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		return 1
	}

	var results []result
	printHeader()
	for _, name := range c.stores {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(os.Stderr, "loadtest: starting %s\n", name)
		env, err := startStore(ctx, name, c.drip)
		if err != nil {
			fmt.Fprintf(os.Stderr, "loadtest: %s: %v\n", name, err)
			return 1
		}
		for _, b := range c.busy {
			for _, w := range c.workloads {
				if ctx.Err() != nil {
					break
				}
				r := runOne(ctx, &c, env, rulesFile, w, c.clients, c.duration, b, nil)
				r.print()
				results = append(results, r)
			}
			for _, f := range c.faults {
				for range c.faultRepeat {
					if ctx.Err() != nil || !slices.Contains(f.stores, name) {
						continue
					}
					r := runFault(ctx, &c, env, rulesFile, b, &f)
					r.print()
					results = append(results, r)
				}
			}
		}
		env.stop()
	}
	printDetails(results)
	if ctx.Err() != nil {
		return 130
	}
	return 0
}

func usage(err error) int {
	fmt.Fprintln(os.Stderr, "loadtest:", err)
	return 2
}

// pick chooses items of all by a comma list of names, "all" or "none".
func pick[T any](list string, all []T, name func(T) string) ([]T, error) {
	switch list {
	case "all":
		return all, nil
	case "none", "":
		return nil, nil
	}
	var out []T
	for n := range strings.SplitSeq(list, ",") {
		i := slices.IndexFunc(all, func(t T) bool { return name(t) == strings.TrimSpace(n) })
		if i < 0 {
			var names []string
			for _, t := range all {
				names = append(names, name(t))
			}
			return nil, fmt.Errorf("unknown %q: want all, none or some of %s", n, strings.Join(names, ", "))
		}
		out = append(out, all[i])
	}
	return out, nil
}

// result is what a run measured.
type result struct {
	store, work string
	busy        int
	clients     int
	fault       *fault

	decisions, allowed, denied, errors int64
	errs                               map[string]int64
	warns                              map[string]int64 // drip serve's warnings
	p50, p99, max                      time.Duration
	over                               int64 // grants over the bound, or slots over max_in_flight
	maxHeld                            int   // in-flight rule: most slots of a key held at once
	slots                              bool
	opens                              int
	opensSampled                       bool // opens read off the state gauge, not a counter
	storeErrs, failOpen                float64
	elapsed                            time.Duration
	setupErr                           error

	// Fault runs, from the fault's start (openAfter) and end (the rest);
	// -1 when it did not happen.
	openAfter, firstOK, lastErr time.Duration
	errsAfter                   int64 // errors of requests sent after the fault ended and its settle time
	errsBefore                  int64 // errors answered before the fault began
}

// runFault runs the fault workload with a fault; a failover on a pair of
// servers of its own.
func runFault(ctx context.Context, c *config, env *storeEnv, rulesFile string, busy int, f *fault) result {
	if f.kind == "failover" {
		// Each failover on servers of its own: a PostgreSQL primary and
		// standby, or a fresh Sentinel set.
		start := startFailoverPair
		if env.name == "sentinel" {
			start = func(ctx context.Context, dripBin string) (*storeEnv, error) {
				return startStore(ctx, "sentinel", dripBin)
			}
		}
		pair, err := start(ctx, c.drip)
		if err != nil {
			return result{store: env.name, work: c.faultWorkload.describe(c.keys), busy: busy, clients: c.faultClients, fault: f, setupErr: err}
		}
		defer pair.stop()
		env = pair
	}
	return runOne(ctx, c, env, rulesFile, c.faultWorkload, c.faultClients, f.run, busy, f)
}

func runOne(ctx context.Context, c *config, env *storeEnv, rulesFile string, w workload, clients int, duration time.Duration, busy int, f *fault) result {
	r := result{store: env.name, work: w.describe(c.keys), busy: busy, clients: clients, fault: f,
		errs: map[string]int64{}, openAfter: -1, firstOK: -1, lastErr: -1, slots: w.rule == "slots"}
	var id [4]byte
	rand.Read(id[:])
	runID := hex.EncodeToString(id[:])
	keys := []string{runID + "-hot"}
	if w.rule == "many" {
		keys = make([]string, c.keys)
		for i := range keys {
			keys[i] = runID + "-" + strconv.Itoa(i)
		}
	}
	var up *upstream
	upURL := ""
	if w.gateway {
		var err error
		if up, err = startUpstream(c.hold); err != nil {
			r.setupErr = err
			return r
		}
		defer up.close()
		upURL = "http://" + up.addr
	}
	srv, err := startServe(ctx, c.drip, c.dir, env.url, rulesFile, upURL, c.serveArgs)
	if err != nil {
		r.setupErr = err
		return r
	}
	defer srv.stop()
	if busy > 0 {
		stopBusy, err := busyLoops(busy)
		if err != nil {
			r.setupErr = err
			return r
		}
		defer stopBusy()
	}
	every := 100 * time.Millisecond
	if f != nil {
		every = 50 * time.Millisecond
	}
	start := time.Now()
	smp := startSampler(ctx, srv.admin, start, every)
	var fStart, fEnd time.Duration
	fDone := make(chan error, 1)
	if f != nil {
		go func() { fDone <- makeFault(ctx, env, f, start, &fStart, &fEnd) }()
	} else {
		fDone <- nil
	}
	l := &load{w: w, addr: srv.addr, clients: clients, duration: duration, keys: keys, hold: c.hold, slots: newInflight()}
	recs := l.run(ctx, start)
	if err := <-fDone; err != nil {
		r.setupErr = fmt.Errorf("fault %s: %w", f.name, err)
	}
	r.elapsed = time.Since(start)
	openings := smp.stop()
	m, err := readMetrics(&httpClient, srv.admin)
	if err != nil {
		r.setupErr = fmt.Errorf("metrics: %w", err)
	}

	var samples []sample
	allowed := map[string]int64{}
	for _, rec := range recs {
		samples = append(samples, rec.samples...)
		for k, n := range rec.allowed {
			allowed[k] += n
		}
		for msg, n := range rec.errs {
			r.errs[msg] += n
			r.errors += n
		}
	}
	r.decisions = int64(len(samples))
	lats := make([]time.Duration, 0, len(samples))
	brkSeen := false
	for _, s := range samples {
		lats = append(lats, s.lat)
		switch s.kind {
		case kindAllowed:
			r.allowed++
		case kindDenied:
			r.denied++
		}
		brkSeen = brkSeen || s.brk
	}
	slices.Sort(lats)
	if n := len(lats); n > 0 {
		r.p50, r.p99, r.max = lats[n/2], lats[min(n-1, n*99/100)], lats[n-1]
	}

	// Over-admission.
	switch {
	case w.rule == "slots" && w.gateway:
		r.over, r.maxHeld = up.slots.over, up.slots.max
	case w.rule == "slots":
		r.over, r.maxHeld = l.slots.over, l.slots.max
	default:
		if w.gateway {
			allowed = up.admitted
		}
		rate, burst := hotRate, hotBurst
		if w.rule == "many" {
			rate, burst = manyRate, manyBurst
		}
		bound := burst + rate*r.elapsed.Seconds()
		if f != nil && f.kind == "kill" && env.redis != nil {
			bound += burst // a restarted Redis has lost its data: a bucket starts full again
		}
		for _, n := range allowed {
			if excess := n - int64(math.Floor(bound+1e-9)); excess > 0 {
				r.over += excess
			}
		}
	}

	// Breaker openings, store errors, decisions made without the store.
	logOpens, warns := readServeLog(srv.log)
	r.warns = warns
	if m.hasOpens {
		r.opens = int(m.opens)
	} else {
		r.opens, r.opensSampled = max(len(openings), logOpens), true
		if r.opens == 0 && brkSeen {
			r.opens = 1 // open too briefly for the gauge's reads, but answers said so
		}
	}
	r.storeErrs = m.storeErrs
	r.failOpen = m.outcomes["error_allowed"] + m.outcomes["local_allowed"] + m.outcomes["local_denied"]

	if f != nil {
		r.faultTimeline(samples, openings, fStart, fEnd, f.settle)
	}
	return r
}

// faultTimeline finds, in a fault run's answers, how soon the breaker
// opened after the fault began, and how soon after the fault ended the
// answers were decisions again.
func (r *result) faultTimeline(samples []sample, openings []time.Duration, fStart, fEnd, settle time.Duration) {
	for _, o := range openings {
		if o >= fStart {
			r.openAfter = o - fStart
			break
		}
	}
	for _, s := range samples {
		if s.brk && s.end >= fStart && (r.openAfter < 0 || s.end-fStart < r.openAfter) {
			r.openAfter = s.end - fStart
		}
		sent := s.end - s.lat
		if s.kind != kindError && sent >= fEnd && (r.firstOK < 0 || s.end-fEnd < r.firstOK) {
			r.firstOK = s.end - fEnd
		}
		if s.kind == kindError && s.end >= fEnd && s.end-fEnd > r.lastErr {
			r.lastErr = s.end - fEnd
		}
		if s.kind == kindError && sent > fEnd+settle {
			r.errsAfter++
		}
		if s.kind == kindError && s.end < fStart {
			r.errsBefore++
		}
	}
}

// makeFault waits until faultAt into the run, makes the fault, and
// records when it began and ended.
func makeFault(ctx context.Context, env *storeEnv, f *fault, start time.Time, fStart, fEnd *time.Duration) error {
	select {
	case <-time.After(time.Until(start.Add(faultAt))):
	case <-ctx.Done():
		return ctx.Err()
	}
	switch f.kind {
	case "pause":
		*fStart = time.Since(start)
		err := env.pause(f.d)
		*fEnd = *fStart + f.d
		return err
	case "lock":
		err := env.lock(ctx, f.d, func() { *fStart = time.Since(start) })
		*fEnd = time.Since(start)
		return err
	case "failover":
		err := env.failover(func() { *fStart = time.Since(start) })
		*fEnd = time.Since(start)
		return err
	default:
		err := env.kill(f.d, func() { *fStart = time.Since(start) })
		*fEnd = time.Since(start)
		return err
	}
}
