package main

import (
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"
)

// upstream is the stand-in service a limiter protects: up to capacity
// requests at once each take base (with ±10% jitter); past it, each
// takes base*n/capacity, as if the n requests shared capacity workers;
// past collapse*capacity it fails (a 500 after collapse*base, the work
// wasted). It ignores its request's context, as most upstreams do: a
// caller that gave up still loads it.
type upstream struct {
	base     time.Duration
	collapse float64
	capacity atomic.Int64
	inFlight atomic.Int64
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	n := u.inFlight.Add(1)
	defer u.inFlight.Add(-1)
	c := float64(u.capacity.Load())
	load := max(1, float64(n)/c)
	jitter := 0.9 + 0.2*rand.Float64()
	if load > u.collapse {
		time.Sleep(time.Duration(float64(u.base) * u.collapse * jitter))
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	time.Sleep(time.Duration(float64(u.base) * load * jitter))
	w.WriteHeader(http.StatusOK)
}
