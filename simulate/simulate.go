// Package simulate shows what a limit does to traffic before it ships: it
// runs a traffic pattern (see ParsePattern), a replay trace (ReadTrace) or
// an access log (ReadLog) against a limit on the memory store, in virtual
// time, and reports what was accepted and denied (Report.WriteSummary) and
// how the bucket evolved (Report.WriteSVG).
//
// Virtual time means every decision is made with a caller-supplied time on
// a fresh memstore: nothing sleeps, so ten seconds of traffic at 60
// requests per second take a millisecond, and the answers are exactly what
// drip's math gives (the same as drip replay on any store).
package simulate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store/memstore"
)

// DefaultKey is the bucket key of events that name none.
const DefaultKey = "client"

// Op is what an event does to its bucket.
type Op uint8

const (
	Take   Op = iota // take Cost tokens (the default)
	Peek             // look, change nothing
	Refund           // give Cost tokens back
	Reset            // forget the bucket: it is full again
)

// Arrival is one request of a run, at its virtual time.
type Arrival struct {
	// At is the virtual time of the request, since the start of the run.
	At time.Duration
	// Key names the bucket; "" means DefaultKey.
	Key string
	// Op is Take (the zero value), Peek, Refund or Reset.
	Op Op
	// Cost is the tokens taken (or refunded). Pattern events get it from
	// their template.
	Cost float64
	// Reserve lets a take go into debt (see drip.Request.Reserve).
	Reserve bool
	// Limit is the event's own limit; nil means Options.Limit.
	Limit *drip.Limit
}

// Options configures Run.
type Options struct {
	// Limit applies to every event without a limit of its own.
	Limit drip.Limit
	// End is the length of the run. It is at least just past the last
	// event and at least one period of the chart key's limit; a pattern's
	// Duration is the natural value.
	End time.Duration
	// Step is the length of a row of the summary table. Zero means one
	// second, or longer for runs of more than a minute (about 60 rows).
	Step time.Duration
	// ChartKey is the bucket whose tokens are charted and tabulated; ""
	// means the key with the most takes.
	ChartKey string
	// Keep is how many of the first takes to keep in Report.First.
	Keep int
	// From is the instant of virtual time 0; zero means the Unix epoch
	// (so that a fixed window's grid is the one drip replay gives the same
	// trace). A calendar window's boundaries (month ends, daylight saving
	// time) are those of the days from From on.
	From time.Time
}

// Record is one take of a run and the decision on it.
type Record struct {
	// N is the take's number in the run, from 1.
	N        int
	Arrival  Arrival
	Decision drip.Decision
}

// Row counts the takes of one span of time.
type Row struct {
	From, To time.Duration
	// Sent, Accepted and Denied count takes (requests, not tokens).
	Sent, Accepted, Denied int
	// Tokens is what the chart key's bucket holds at To (before any
	// request at that instant). Only set for Report.Rows.
	Tokens float64
}

// Ratio is the share of the span's takes that were accepted (0 when none
// were sent).
func (r Row) Ratio() float64 {
	if r.Sent == 0 {
		return 0
	}
	return float64(r.Accepted) / float64(r.Sent)
}

// AcceptedPerSecond is the accepted takes per second over the span.
func (r Row) AcceptedPerSecond() float64 {
	if r.To <= r.From {
		return 0
	}
	return float64(r.Accepted) / (r.To - r.From).Seconds()
}

// Sample is the chart key's tokens at one instant.
type Sample struct {
	At     time.Duration
	Tokens float64
}

// Report is what a run did.
type Report struct {
	// Limit is the chart key's limit.
	Limit drip.Limit
	// ChartKey is the bucket whose tokens Rows and Tokens follow.
	ChartKey string
	// Keys is the number of distinct keys taken from.
	Keys int
	// End is the length of the run.
	End time.Duration
	// Total counts every take of the run, from 0 to End.
	Total Row
	// Reserved counts takes allowed in debt: work delayed by RetryAfter.
	Reserved int
	// FirstDenial is the first denied take, or nil.
	FirstDenial *Record
	// LongestRetry is the denied take with the longest RetryAfter, or nil.
	LongestRetry *Record
	// LongestDelay is the reserved take with the longest RetryAfter (the
	// longest wait of reserved work), or nil.
	LongestDelay *Record
	// Steady counts the takes of the end of the run: its second half, cut
	// to whole periods of the limit when it holds one or more. It shows how
	// the limit holds a sustained load once an initial burst is spent.
	Steady Row
	// Rows counts the takes of each step of the run.
	Rows []Row
	// Bars counts the takes of the chart's columns (about 60 over the run).
	Bars []Row
	// Tokens follows the chart key's bucket: before and after each of its
	// decisions and at regular instants in between, thinned to at most 3
	// samples per 1/800 of the run (about a pixel of the chart).
	Tokens []Sample
	// First holds the first Options.Keep takes.
	First []Record
}

// Result is the old name of Report.
//
// Deprecated: use Report. Result names one evaluation of the math
// (bucket.Result).
type Result = Report

// Event is the old name of Arrival.
//
// Deprecated: use Arrival. An event is what the engine tells its
// observer (engine.Event).
type Event = Arrival

// Outcome is the old name of Record. Its field Event is now Arrival.
//
// Deprecated: use Record. An outcome is a front door's decision
// (engine.Outcome).
type Outcome = Record

// ErrConcurrency is Run's error for a concurrency limit: simulated
// requests have no duration, so none would ever give its slot back, and
// what such a limit does depends on how long requests run.
var ErrConcurrency = errors.New("concurrency limits (requests in flight) cannot be simulated: simulated requests have no duration")

// Run plays events (in time order; events at the same instant in their
// given order) on a fresh memory store, in virtual time. It returns an
// error for an event the store rejects (a bad limit, a cost above the burst
// without reserve), naming the event.
func Run(ctx context.Context, events []Arrival, o Options) (*Report, error) {
	evs := slices.Clone(events)
	slices.SortStableFunc(evs, func(a, b Arrival) int { return cmp.Compare(a.At, b.At) })
	for i := range evs {
		if evs[i].Key == "" {
			evs[i].Key = DefaultKey
		}
		if evs[i].At < 0 {
			return nil, fmt.Errorf("event at %v: negative time", evs[i].At)
		}
	}

	res := &Report{ChartKey: o.ChartKey}
	// The chart key: asked for, or the busiest.
	takes := map[string]int{}
	var order []string
	for _, e := range evs {
		if e.Op != Take {
			continue
		}
		if _, ok := takes[e.Key]; !ok {
			order = append(order, e.Key)
		}
		takes[e.Key]++
	}
	res.Keys = len(takes)
	if res.ChartKey == "" {
		res.ChartKey = DefaultKey
		best := 0
		for _, k := range order {
			if takes[k] > best {
				res.ChartKey, best = k, takes[k]
			}
		}
	}
	res.Limit = o.Limit
	for _, e := range evs {
		if e.Key == res.ChartKey && e.Limit != nil {
			res.Limit = *e.Limit
			break
		}
	}
	if err := res.Limit.Validate(); err != nil {
		return nil, err
	}
	if res.Limit.Algorithm == drip.Concurrency {
		return nil, ErrConcurrency
	}
	for _, e := range evs {
		if e.Limit != nil && e.Limit.Algorithm == drip.Concurrency {
			return nil, ErrConcurrency
		}
	}

	end := max(o.End, periodOf(res.Limit))
	if n := len(evs); n > 0 {
		end = max(end, evs[n-1].At+1)
	}
	step := o.Step
	if step <= 0 {
		step = max(time.Second, niceDuration(end/60))
	}
	// The totals and the steady state cover the traffic itself; only the
	// table and the chart are padded to whole rows (a padded tail with no
	// traffic would understate the steady rate).
	span := end
	if r := end % step; r != 0 {
		end += step - r // whole rows
	}
	res.End = end
	barStep := niceDuration(end / 60)
	sampleStep := max(time.Microsecond, end/800) // about a pixel of the chart
	res.Rows = spans(end, step)
	res.Bars = spans(end, barStep)
	res.Total = Row{To: span}
	half := span / 2
	if p := periodOf(res.Limit); half >= p {
		half -= half % p // whole periods, so a window's refill counts once
	}
	res.Steady = Row{From: span - half, To: span}

	ms := memstore.New(memstore.WithSweep(0), memstore.WithMaxKeys(max(1024, 2*len(takes))))
	defer ms.Close()
	d := decider{ms: ms}
	apply := func(op bucket.Op, at time.Time, r drip.Request) (drip.Decision, error) {
		return d.apply(ctx, op, at, r)
	}
	// Virtual time 0 is the Unix epoch, so a fixed window's grid is the
	// one drip replay gives the same trace.
	from := o.From
	if from.IsZero() {
		from = time.Unix(0, 0)
	}
	at := func(d time.Duration) time.Time { return from.Add(d) }
	chartReq := drip.Request{Key: res.ChartKey, Limit: res.Limit}

	thin := thinner{step: sampleStep}
	peek := func(t time.Duration) (float64, error) {
		d, err := apply(bucket.Peek, at(t), chartReq)
		return d.Tokens, err
	}
	// Probes: the chart key's tokens at each sample instant and at the
	// end of each row, taken before the events of that instant.
	nextSample, nextRow := time.Duration(0), 0
	probe := func(until time.Duration, inclusive bool) error {
		for nextSample < until || (inclusive && nextSample == until) {
			v, err := peek(nextSample)
			if err != nil {
				return err
			}
			thin.add(Sample{nextSample, v})
			nextSample += sampleStep
		}
		for nextRow < len(res.Rows) && (res.Rows[nextRow].To < until || (inclusive && res.Rows[nextRow].To == until)) {
			v, err := peek(res.Rows[nextRow].To)
			if err != nil {
				return err
			}
			res.Rows[nextRow].Tokens = v
			nextRow++
		}
		return nil
	}

	n := 0
	for _, e := range evs {
		if err := probe(e.At, true); err != nil {
			return nil, err
		}
		r := drip.Request{Key: e.Key, Limit: o.Limit, Cost: e.Cost, Reserve: e.Reserve}
		if e.Limit != nil {
			r.Limit = *e.Limit
		}
		if e.Key == res.ChartKey {
			chartReq.Limit = r.Limit
		}
		var err error
		var d drip.Decision
		switch e.Op {
		case Reset:
			err = ms.Reset(ctx, e.Key)
			if e.Key == res.ChartKey && err == nil {
				var v float64
				v, err = peek(e.At)
				thin.add(Sample{e.At, v})
			}
		case Peek:
			_, err = apply(bucket.Peek, at(e.At), r)
		case Refund:
			d, err = apply(bucket.Refund, at(e.At), r)
			if e.Key == res.ChartKey && err == nil {
				thin.add(Sample{e.At, d.Tokens})
			}
		default:
			d, err = apply(bucket.Take, at(e.At), r)
		}
		if err != nil {
			return nil, fmt.Errorf("request at %.3fs, key %q: %w", e.At.Seconds(), e.Key, err)
		}
		if e.Op != Take {
			continue
		}
		n++
		out := Record{N: n, Arrival: e, Decision: d}
		if len(res.First) < o.Keep {
			res.First = append(res.First, out)
		}
		res.Total.count(d.Allowed)
		res.Rows[index(e.At, step, len(res.Rows))].count(d.Allowed)
		res.Bars[index(e.At, barStep, len(res.Bars))].count(d.Allowed)
		if e.At >= res.Steady.From {
			res.Steady.count(d.Allowed)
		}
		switch {
		case !d.Allowed:
			if res.FirstDenial == nil {
				res.FirstDenial = &out
			}
			if res.LongestRetry == nil || d.RetryAfter > res.LongestRetry.Decision.RetryAfter {
				res.LongestRetry = &out
			}
		case d.RetryAfter > 0:
			res.Reserved++
			if res.LongestDelay == nil || d.RetryAfter > res.LongestDelay.Decision.RetryAfter {
				res.LongestDelay = &out
			}
		}
		if e.Key == res.ChartKey {
			if d.Allowed {
				// Before the take, then after it: a drop at one instant.
				thin.add(Sample{e.At, d.Tokens + e.Cost})
			}
			thin.add(Sample{e.At, d.Tokens})
		}
	}
	if err := probe(end, true); err != nil {
		return nil, err
	}
	res.Tokens = thin.done()
	return res, nil
}
