package simulate

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// MaxArrivals bounds the number of requests a pattern, a trace or a log
// may give a run.
const MaxArrivals = 10_000_000

// MaxEvents is the old name of MaxArrivals.
//
// Deprecated: use MaxArrivals.
const MaxEvents = MaxArrivals

// PhaseKind is what a phase of a pattern sends.
type PhaseKind uint8

const (
	Steady PhaseKind = iota // Rate requests per Per, evenly spaced, for For
	Idle                    // nothing, for For
	Burst                   // Count requests at one instant
)

// Phase is one part of a pattern.
type Phase struct {
	Kind  PhaseKind
	Rate  float64       // Steady: requests per Per
	Per   time.Duration // Steady: the unit of Rate
	For   time.Duration // Steady and Idle: how long the phase lasts
	Count int           // Burst: how many requests at once
}

// Pattern is a traffic pattern: phases one after the other.
type Pattern []Phase

var (
	steadyRE = regexp.MustCompile(`^([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*(?:rps|/\s*([0-9.]*[a-zµ]+))\s+for\s+(\S+)$`)
	idleRE   = regexp.MustCompile(`^idle\s+(\S+)$`)
	burstRE  = regexp.MustCompile(`^([0-9]+)\s+at\s+once$`)
)

// ParsePattern reads a pattern: phases separated by commas, run one after
// the other.
//
//	60/s for 10s     60 requests per second, evenly spaced (the first at the
//	                 phase's start), for 10 seconds: 600 requests
//	60rps for 10s    the same
//	300/m for 2m     the unit of a rate is any Go duration: 5/100ms, 1/2s
//	idle 5s          no requests for 5 seconds
//	100 at once      100 requests at the same instant (takes no time)
//
// For example "60/s for 10s, idle 5s, 100 at once, 10/s for 5s". Spaces
// and case do not matter.
func ParsePattern(s string) (Pattern, error) {
	var p Pattern
	var problems []string
	for i, part := range strings.Split(s, ",") {
		ph, err := parsePhase(strings.Join(strings.Fields(strings.ToLower(part)), " "))
		if err != nil {
			problems = append(problems, fmt.Sprintf("phase %d %q: %v", i+1, strings.TrimSpace(part), err))
			continue
		}
		p = append(p, ph)
	}
	if len(problems) > 0 {
		return nil, errors.New(strings.Join(problems, "; "))
	}
	if n := p.Len(); n > MaxArrivals {
		return nil, fmt.Errorf("the pattern sends %d requests, more than %d", n, MaxArrivals)
	}
	return p, nil
}

const phaseSyntax = `want "60/s for 10s", "idle 5s" or "100 at once"`

func parsePhase(s string) (Phase, error) {
	if s == "" {
		return Phase{}, errors.New("empty; " + phaseSyntax)
	}
	if m := steadyRE.FindStringSubmatch(s); m != nil {
		rate, err := strconv.ParseFloat(m[1], 64)
		if err != nil || rate <= 0 || math.IsInf(rate, 0) {
			return Phase{}, fmt.Errorf("rate %q must be a number > 0", m[1])
		}
		per := time.Second
		if u := m[2]; u != "" {
			if u[0] < '0' || u[0] > '9' {
				u = "1" + u
			}
			if per, err = time.ParseDuration(u); err != nil || per <= 0 {
				return Phase{}, fmt.Errorf("unit %q is not a duration such as s, m, 100ms", m[2])
			}
		}
		d, err := parseFor(m[3])
		if err != nil {
			return Phase{}, err
		}
		return Phase{Kind: Steady, Rate: rate, Per: per, For: d}, nil
	}
	if m := idleRE.FindStringSubmatch(s); m != nil {
		d, err := parseFor(m[1])
		if err != nil {
			return Phase{}, err
		}
		return Phase{Kind: Idle, For: d}, nil
	}
	if m := burstRE.FindStringSubmatch(s); m != nil {
		n, err := strconv.Atoi(m[1])
		if err != nil || n <= 0 || n > MaxArrivals {
			return Phase{}, fmt.Errorf("count %q must be a whole number from 1 to %d", m[1], MaxArrivals)
		}
		return Phase{Kind: Burst, Count: n}, nil
	}
	return Phase{}, errors.New(phaseSyntax)
}

func parseFor(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("duration %q must be a Go duration > 0 such as 10s, 1m30s", s)
	}
	return d, nil
}

// count is how many requests the phase sends.
func (ph Phase) count() int {
	switch ph.Kind {
	case Burst:
		return ph.Count
	case Steady:
		// Request i is sent at i*Per/Rate, for every i with i*Per/Rate <
		// For. The epsilon absorbs float error in exact products.
		n := math.Ceil(ph.For.Seconds()*ph.Rate/ph.Per.Seconds() - 1e-9)
		return int(min(n, MaxArrivals+1))
	}
	return 0
}

// Len is the number of requests the pattern sends.
func (p Pattern) Len() int {
	n := 0
	for _, ph := range p {
		n = min(n+ph.count(), MaxArrivals+1)
	}
	return n
}

// Duration is how long the pattern lasts: the sum of its phases.
func (p Pattern) Duration() time.Duration {
	var d time.Duration
	for _, ph := range p {
		d += ph.For
	}
	return d
}

// Arrivals returns the pattern's requests, each a copy of tmpl (key, cost,
// reserve, limit) at its own time.
func (p Pattern) Arrivals(tmpl Arrival) []Arrival {
	evs := make([]Arrival, 0, min(p.Len(), MaxArrivals))
	var start time.Duration
	for _, ph := range p {
		n := ph.count()
		for i := range n {
			e := tmpl
			e.At = start
			if ph.Kind == Steady {
				e.At += time.Duration(math.Round(float64(i) * float64(ph.Per) / ph.Rate))
			}
			evs = append(evs, e)
		}
		start += ph.For
	}
	return evs
}

// Events is Arrivals.
//
// Deprecated: use Arrivals.
func (p Pattern) Events(tmpl Arrival) []Arrival { return p.Arrivals(tmpl) }

// String writes p in the syntax ParsePattern reads.
func (p Pattern) String() string {
	parts := make([]string, len(p))
	for i, ph := range p {
		switch ph.Kind {
		case Steady:
			unit := "s"
			switch ph.Per {
			case time.Second:
			case time.Minute:
				unit = "m"
			case time.Hour:
				unit = "h"
			default:
				unit = ph.Per.String()
			}
			parts[i] = fmt.Sprintf("%s/%s for %s", strconv.FormatFloat(ph.Rate, 'g', -1, 64), unit, ph.For)
		case Idle:
			parts[i] = "idle " + ph.For.String()
		case Burst:
			parts[i] = strconv.Itoa(ph.Count) + " at once"
		}
	}
	return strings.Join(parts, ", ")
}
