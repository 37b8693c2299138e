package main

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// The classes of the offered load, most important first, as the
// X-Priority header names them.
var classes = []string{"critical", "default", "sheddable", "batch"}

// outcome is what became of one request.
type outcome struct {
	at      time.Duration // arrival, from the start of the run
	latency time.Duration
	class   uint8
	status  int // 0: the caller's deadline passed first
}

// recorder is a minimal http.ResponseWriter: the status is all the
// harness reads.
type recorder struct {
	h      http.Header
	status int
}

func (r *recorder) Header() http.Header {
	if r.h == nil {
		r.h = make(http.Header)
	}
	return r.h
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return len(b), nil
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

// generate offers rate requests per second to h for d, open loop:
// arrivals come on schedule whatever h does, each from a goroutine of
// its own, with a deadline of timeout. At d/2 it calls step. It
// returns every request's outcome once all have ended.
func generate(h http.Handler, rate float64, d, timeout time.Duration, shares []float64, step func()) []outcome {
	var (
		mu   sync.Mutex
		outs = make([]outcome, 0, int(rate*d.Seconds())+16)
		wg   sync.WaitGroup
	)
	cum := make([]float64, len(shares))
	total := 0.0
	for i, s := range shares {
		total += s
		cum[i] = total
	}
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	sent, stepped := 0, false
	for now := range tick.C {
		el := now.Sub(start)
		if el >= d {
			break
		}
		if !stepped && el >= d/2 {
			step()
			stepped = true
		}
		due := int(rate * el.Seconds())
		for ; sent < due; sent++ {
			x := rand.Float64() * total
			class := uint8(0)
			for int(class) < len(cum)-1 && x >= cum[class] {
				class++
			}
			wg.Add(1)
			go func(at time.Duration, class uint8) {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://upstream/work", nil)
				req.Header.Set("X-Priority", classes[class])
				req.RemoteAddr = "10.0.0.1:1234"
				rec := &recorder{}
				t0 := time.Now()
				h.ServeHTTP(rec, req)
				o := outcome{at: at, latency: time.Since(t0), class: class, status: rec.status}
				if o.status == 0 {
					o.status = http.StatusOK
				}
				if o.latency > timeout {
					o.status = 0
				}
				mu.Lock()
				outs = append(outs, o)
				mu.Unlock()
			}(el, class)
		}
	}
	wg.Wait()
	return outs
}
