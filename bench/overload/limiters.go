package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/priority"
	"github.com/go-kratos/aegis/ratelimit"
	"github.com/go-kratos/aegis/ratelimit/bbr"
	"github.com/zeromicro/go-zero/core/load"
	"github.com/zeromicro/go-zero/core/logx"

	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// A contender wraps the upstream in one limiter, built fresh for each
// run; stop ends what it started. A contender this build cannot run
// (a kind of rule it does not know) has a missing reason instead.
type contender struct {
	name    string
	build   func(next http.Handler) (h http.Handler, stop func())
	missing error
}

func nothing() {}

// static is a plain semaphore of n slots that rejects when full: the
// limit a person would write down, for the best n in hindsight.
func static(n int) contender {
	return contender{name: fmt.Sprintf("static %d", n), build: func(next http.Handler) (http.Handler, func()) {
		sem := make(chan struct{}, n)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
				next.ServeHTTP(w, r)
			default:
				w.WriteHeader(http.StatusTooManyRequests)
			}
		}), nothing
	}}
}

func none() contender {
	return contender{name: "no limiter", build: func(next http.Handler) (http.Handler, func()) { return next, nothing }}
}

// dripRules is drip's middleware from a rules file.
func dripRules(name, src string) contender {
	set, err := rules.Parse([]byte(src), name+".json")
	if err != nil {
		return contender{name: name, missing: err}
	}
	return contender{name: name, build: func(next http.Handler) (http.Handler, func()) {
		store := memstore.New()
		lim := httplimit.New(store, set)
		return lim.Handler(next), func() { lim.Close(); store.Close() }
	}}
}

// dripStatic is drip's static concurrency rule of n slots, on all
// traffic.
func dripStatic(n int) contender {
	return dripRules(fmt.Sprintf("drip in_flight %d", n), fmt.Sprintf(`{"rules": [
  {"name": "upstream", "limit_keys": ["global"], "algorithm": "concurrency",
   "algorithm_config": {"max_in_flight": %d}}]}`, n))
}

// dripStaticWait is dripStatic whose requests may wait up to wait for
// a slot, in a queue of the rule's default bound (100).
func dripStaticWait(n int, wait time.Duration) contender {
	return dripRules(fmt.Sprintf("drip in_flight %d, max_wait %v", n, wait), fmt.Sprintf(`{"rules": [
  {"name": "upstream", "limit_keys": ["global"], "algorithm": "concurrency", "max_wait": %q,
   "algorithm_config": {"max_in_flight": %d}}]}`, wait.String(), n))
}

// dripAdaptive is drip's adaptive rule at its defaults, each request's
// class read from its X-Priority header (a share of the learned limit
// kept for critical requests, the default 10%); wait > 0 lets requests
// wait that long for a slot, in its queue ordered by class.
func dripAdaptive(wait time.Duration) contender {
	name, extra := "drip adaptive", ""
	if wait > 0 {
		name, extra = fmt.Sprintf("drip adaptive, max_wait %v", wait), fmt.Sprintf(`, "max_wait": %q`, wait.String())
	}
	return dripRules(name, `{"rules": [
  {"name": "upstream", "limit_keys": ["global"], "algorithm": "adaptive",
   "priority_from": "header:x-priority"`+extra+`}]}`)
}

// failsafeAdaptive is failsafe-go's adaptive limiter at its defaults,
// through its own net/http handler.
func failsafeAdaptive() contender {
	return contender{name: "failsafe-go adaptive", build: func(next http.Handler) (http.Handler, func()) {
		lim := adaptivelimiter.NewWithDefaults[*http.Response]()
		return failsafehttp.NewHandler(next, lim), nothing
	}}
}

// failsafePriority is failsafe-go's priority limiter (its queueing
// adaptive limiter and a prioritizer calibrated every second) at its
// defaults; the class maps onto its priorities, a level drawn at random
// within each as its handler does.
func failsafePriority() contender {
	prio := map[string]priority.Priority{
		"critical": priority.VeryHigh, "default": priority.Medium,
		"sheddable": priority.Low, "batch": priority.VeryLow,
	}
	return contender{name: "failsafe-go priority", build: func(next http.Handler) (http.Handler, func()) {
		p := adaptivelimiter.NewPrioritizer()
		stop := p.ScheduleCalibrations(context.Background(), time.Second)
		lim := adaptivelimiter.NewBuilder[*http.Response]().BuildPrioritized(p)
		h := failsafehttp.NewHandlerWithExecutor(next, failsafe.With[*http.Response](lim))
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := priority.ContextWithLevel(r.Context(), prio[r.Header.Get("X-Priority")].RandomLevel())
			h.ServeHTTP(w, r.WithContext(ctx))
		}), stop
	}}
}

// goZero is go-zero's adaptive shedder at its defaults, as its REST
// server runs it: a failure is a 5xx, and critical requests go through
// a shedder of the higher CPU threshold go-zero gives routes marked
// with priority.
//
// gated false sets the CPU threshold to 0, so that it sheds on its
// estimate of the in-flight requests the upstream can take alone (what
// it does when the CPU is over the threshold): a variant for an
// upstream whose load is not this process's CPU.
func goZero(gated bool) contender {
	logx.Disable()
	logx.DisableStat()
	name, plainT, prioT := "go-zero shedder", int64(900), int64((900+1000)/2)
	if !gated {
		name, plainT, prioT = "go-zero shedder, no CPU gate", 0, 0
	}
	return contender{name: name, build: func(next http.Handler) (http.Handler, func()) {
		plain := load.NewAdaptiveShedder(load.WithCpuThreshold(plainT))
		prio := load.NewAdaptiveShedder(load.WithCpuThreshold(prioT))
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s := plain
			if r.Header.Get("X-Priority") == "critical" {
				s = prio
			}
			promise, err := s.Allow()
			if err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			rec := &statusWriter{ResponseWriter: w}
			next.ServeHTTP(rec, r)
			if rec.status >= 500 {
				promise.Fail()
			} else {
				promise.Pass()
			}
		}), nothing
	}}
}

// kratosBBR is go-kratos/aegis' BBR limiter at its defaults, as
// kratos' ratelimit middleware runs it; gated false sets its CPU
// threshold to 0, as for goZero.
func kratosBBR(gated bool) contender {
	name, opts := "kratos BBR", []bbr.Option(nil)
	if !gated {
		name, opts = "kratos BBR, no CPU gate", []bbr.Option{bbr.WithCPUThreshold(0)}
	}
	return contender{name: name, build: func(next http.Handler) (http.Handler, func()) {
		lim := bbr.NewLimiter(opts...)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			done, err := lim.Allow()
			if err != nil {
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
			rec := &statusWriter{ResponseWriter: w}
			next.ServeHTTP(rec, r)
			var derr error
			if rec.status >= 500 {
				derr = fmt.Errorf("status %d", rec.status)
			}
			done(ratelimit.DoneInfo{Err: derr})
		}), nothing
	}}
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}
