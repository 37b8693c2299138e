package main

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// scrape is what one read of drip serve's /metrics says about the store
// and its breaker.
type scrape struct {
	open      bool               // drip_store_circuit_state{state="open"} is 1
	opens     float64            // a counter of openings, if drip serve has one
	hasOpens  bool               // such a counter exists
	storeErrs float64            // drip_store_errors_total, every op
	outcomes  map[string]float64 // drip_decisions_total by outcome, every rule
}

// readMetrics reads the Prometheus text of /metrics. A counter of breaker
// openings is any drip_ counter whose name speaks of the circuit or the
// breaker and whose labels name the open state (to="open", state="open").
func readMetrics(client *http.Client, admin string) (scrape, error) {
	s := scrape{outcomes: map[string]float64{}}
	resp, err := client.Get("http://" + admin + "/metrics")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "drip_") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		series := line[:sp]
		name, labels, _ := strings.Cut(series, "{")
		switch {
		case name == "drip_store_circuit_state":
			if strings.Contains(labels, `state="open"`) && v == 1 {
				s.open = true
			}
		case (strings.Contains(name, "circuit") || strings.Contains(name, "breaker")) && strings.HasSuffix(name, "_total"):
			if strings.Contains(labels, `="open"`) || strings.Contains(name, "open") {
				s.opens += v
				s.hasOpens = true
			}
		case name == "drip_store_errors_total":
			s.storeErrs += v
		case name == "drip_decisions_total":
			if _, rest, ok := strings.Cut(labels, `outcome="`); ok {
				o, _, _ := strings.Cut(rest, `"`)
				s.outcomes[o] += v
			}
		}
	}
	return s, sc.Err()
}

// sampler reads /metrics every interval until stopped, and keeps when it
// saw the breaker open (the state gauge going from not open to open).
type sampler struct {
	mu       sync.Mutex
	openings []time.Duration // since the run's start
	wasOpen  bool
	stopped  chan struct{}
	done     chan struct{}
}

func startSampler(ctx context.Context, admin string, start time.Time, every time.Duration) *sampler {
	s := &sampler{stopped: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Timeout: 2 * time.Second}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if m, err := readMetrics(client, admin); err == nil {
				s.mu.Lock()
				if m.open && !s.wasOpen {
					s.openings = append(s.openings, time.Since(start))
				}
				s.wasOpen = m.open
				s.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-s.stopped:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) stop() []time.Duration {
	close(s.stopped)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.openings
}
