package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"
)

// The limits of the rules file: a hot key's bucket, a bucket per key of
// many that runs dry on some keys, and an in-flight limit.
const (
	hotRate     = 100.0 // per second
	hotBurst    = 100.0
	manyRate    = 0.1 // per second: 1 per 10 s
	manyBurst   = 3.0
	maxInFlight = 5
)

// rulesJSON is the rules file of every run. The decision API names the
// rules; the gateway matches them on the path, keyed on X-Key. on_error is
// left at its default.
const rulesJSON = `{
  "rules": [
    {"name": "hot", "limit_keys": ["header:x-key"], "match": {"path": "/hot/*"},
     "algorithm_config": {"rps": 100, "burst": 100}},
    {"name": "many", "limit_keys": ["header:x-key"], "match": {"path": "/many/*"},
     "algorithm_config": {"rate": 1, "period": "10s", "burst": 3}},
    {"name": "slots", "limit_keys": ["header:x-key"], "match": {"path": "/slots/*"},
     "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 5, "lease_ttl": "30s"}}
  ]
}
`

// workload is what the clients of a run send.
type workload struct {
	name    string
	gateway bool   // through the gateway, else the decision API
	rule    string // hot, many or slots
}

var workloads = []workload{
	{"api-hot", false, "hot"},
	{"api-many", false, "many"},
	{"api-slots", false, "slots"},
	{"gw-hot", true, "hot"},
	{"gw-many", true, "many"},
	{"gw-slots", true, "slots"},
}

func (w workload) describe(keys int) string {
	door := "API take"
	if w.gateway {
		door = "gateway"
	} else if w.rule == "slots" {
		door = "API acquire+release"
	}
	switch w.rule {
	case "hot":
		return door + ", hot key"
	case "many":
		return fmt.Sprintf("%s, %d keys", door, keys)
	}
	return door + fmt.Sprintf(", in-flight max %d, hot key", maxInFlight)
}

// Kinds of answers.
const (
	kindAllowed = iota
	kindDenied
	kindError
)

type sample struct {
	end  time.Duration // since the run's start
	lat  time.Duration
	kind uint8
	brk  bool // an error that says the breaker is open
}

// record is what one client saw.
type record struct {
	samples []sample
	allowed map[string]int64 // decision API buckets: allowed takes by key
	errs    map[string]int64 // error answers by status and message
}

// inflight counts slots held at once per key, and the most seen.
type inflight struct {
	mu   sync.Mutex
	n    map[string]int
	max  int
	over int64 // admissions that took a key over maxInFlight
}

func newInflight() *inflight { return &inflight{n: map[string]int{}} }

func (f *inflight) enter(k string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n[k]++
	if f.n[k] > f.max {
		f.max = f.n[k]
	}
	if f.n[k] > maxInFlight {
		f.over++
	}
}

func (f *inflight) leave(k string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n[k]--
}

// upstream is the gateway's upstream: it counts the requests that reached
// it by key, and holds each /slots/ request for hold while counting how
// many of a key it holds at once.
type upstream struct {
	hold     time.Duration
	mu       sync.Mutex
	admitted map[string]int64
	slots    *inflight
	srv      *http.Server
	addr     string
}

func startUpstream(hold time.Duration) (*upstream, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{hold: hold, admitted: map[string]int64{}, slots: newInflight(), addr: l.Addr().String()}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go u.srv.Serve(l)
	return u, nil
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("X-Key")
	if strings.HasPrefix(r.URL.Path, "/slots/") {
		u.slots.enter(key)
		time.Sleep(u.hold)
		u.slots.leave(key)
	} else {
		u.mu.Lock()
		u.admitted[key]++
		u.mu.Unlock()
	}
	w.Write([]byte("ok\n"))
}

func (u *upstream) close() { u.srv.Close() }

// load is one run's traffic: clients callers for duration on w, against
// addr (the decision API or the gateway).
type load struct {
	w        workload
	addr     string
	clients  int
	duration time.Duration
	keys     []string // the keys of the run (one for a hot key)
	hold     time.Duration
	slots    *inflight // decision API slots held, as the harness sees them
}

var digits = regexp.MustCompile(`[0-9]+(\.[0-9]+)?`)

// message is an error answer's text for counting: its status and the
// body's error (or problem detail), numbers replaced by N.
func message(status int, body []byte) string {
	var e struct {
		Error  string `json:"error"`
		Detail string `json:"detail"`
		Title  string `json:"title"`
	}
	text := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &e) == nil {
		switch {
		case e.Error != "":
			text = e.Error
		case e.Detail != "":
			text = e.Detail
		case e.Title != "":
			text = e.Title
		}
	}
	if len(text) > 160 {
		text = text[:160]
	}
	return fmt.Sprintf("%d %s", status, digits.ReplaceAllString(text, "N"))
}

// run sends traffic until duration has passed since start (or ctx ends)
// and returns what each client saw. Requests in flight at the end finish
// (each within the client's 10 s timeout).
func (l *load) run(ctx context.Context, start time.Time) []*record {
	tr := &http.Transport{MaxIdleConnsPerHost: l.clients + 8, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	recs := make([]*record, l.clients)
	var wg sync.WaitGroup
	for i := range recs {
		rec := &record{allowed: map[string]int64{}, errs: map[string]int64{}}
		recs[i] = rec
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(start.UnixNano())))
			for ctx.Err() == nil && time.Since(start) < l.duration {
				key := l.keys[rng.IntN(len(l.keys))]
				l.one(ctx, client, start, rec, key)
			}
		})
	}
	wg.Wait()
	return recs
}

// one makes one decision (and, for an acquired slot of the decision API,
// holds it and releases it).
func (l *load) one(ctx context.Context, client *http.Client, start time.Time, rec *record, key string) {
	var req *http.Request
	if l.w.gateway {
		req, _ = http.NewRequestWithContext(ctx, http.MethodGet, "http://"+l.addr+"/"+l.w.rule+"/x", nil)
		req.Header.Set("X-Key", key)
	} else {
		path := "/v1/take"
		if l.w.rule == "slots" {
			path = "/v1/acquire"
		}
		body := fmt.Appendf(nil, `{"rule":%q,"values":[%q]}`, l.w.rule, key)
		req, _ = http.NewRequestWithContext(ctx, http.MethodPost, "http://"+l.addr+path, bytes.NewReader(body))
	}
	t0 := time.Now()
	resp, err := client.Do(req)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}
	s := sample{lat: time.Since(t0), end: time.Since(start)}
	var lease string
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return // stopped: not an answer
		}
		s.kind = kindError
		rec.errs[digits.ReplaceAllString("transport: "+err.Error(), "N")]++
	case l.w.gateway && resp.StatusCode == http.StatusOK:
		s.kind = kindAllowed
	case l.w.gateway && resp.StatusCode == http.StatusTooManyRequests:
		s.kind = kindDenied
	case !l.w.gateway && resp.StatusCode == http.StatusOK:
		var d struct {
			Allowed *bool  `json:"allowed"`
			Lease   string `json:"lease"`
		}
		if json.Unmarshal(body, &d) != nil || d.Allowed == nil {
			s.kind = kindError
			rec.errs["200 without a decision: "+message(200, body)]++
			break
		}
		if *d.Allowed {
			s.kind = kindAllowed
			rec.allowed[key]++
			lease = d.Lease
		} else {
			s.kind = kindDenied
		}
	default:
		s.kind = kindError
		m := message(resp.StatusCode, body)
		s.brk = strings.Contains(strings.ToLower(m), "breaker")
		rec.errs[m]++
	}
	rec.samples = append(rec.samples, s)
	if lease == "" || l.w.rule != "slots" {
		return
	}
	l.slots.enter(key)
	time.Sleep(l.hold)
	l.slots.leave(key)
	body = fmt.Appendf(nil, `{"rule":%q,"values":[%q],"lease":%q}`, l.w.rule, key, lease)
	req, _ = http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, "http://"+l.addr+"/v1/release", bytes.NewReader(body))
	resp, err = client.Do(req)
	if err != nil {
		rec.errs[digits.ReplaceAllString("release: transport: "+err.Error(), "N")]++
		return
	}
	body, _ = io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		rec.errs["release: "+message(resp.StatusCode, body)]++
	}
}
