// Package doorgolden replays seeded random traffic through the front
// doors (HTTP middleware, Envoy's rate limit service) and drip replay on
// memory, PostgreSQL and Redis, in virtual time, and writes what each
// answered (statuses, headers, bodies, observer events) to the file
// DOORGOLDEN_OUT names: run it before and after a refactoring of the
// engine and compare the files byte for byte. Without DOORGOLDEN_OUT it
// is skipped (it takes most of a minute).
package doorgolden

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/httplimit"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/server/envoy"
	"github.com/driplimit/drip/storetest"
)

func TestMain(m *testing.M) { testserver.Main(m) }

type events struct {
	engine.NopObserver
	mu  sync.Mutex
	buf *bytes.Buffer
}

func (e *events) Decision(rule string, mode rules.Mode, ev engine.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(e.buf, "  event %s %s %s\n", rule, mode, ev)
}

func (e *events) Tokens(rule string, ev engine.Event, n float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(e.buf, "  tokens %s %s %g\n", rule, ev, n)
}

var stores = []string{"memory", "postgres", "redis"}

func TestDoors(t *testing.T) {
	out := os.Getenv("DOORGOLDEN_OUT")
	if out == "" {
		t.Skip("DOORGOLDEN_OUT unset")
	}
	var all bytes.Buffer
	for _, name := range stores {
		fmt.Fprintf(&all, "== replay %s\n", name)
		for _, tr := range storetest.TraceNames() {
			in, _ := storetest.ReadTrace(tr)
			st := teststores.Open(t, name)
			fmt.Fprintf(&all, "-- %s\n", tr)
			if err := replay.Run(context.Background(), st, "", strings.NewReader(strings.Join(in, "\n")+"\n"), &all); err != nil {
				fmt.Fprintf(&all, "error %v\n", err)
			}
		}
		for seed := uint64(1); seed <= 3; seed++ {
			st := teststores.Open(t, name)
			fmt.Fprintf(&all, "-- random %d\n", seed)
			if err := replay.Run(context.Background(), st, "", strings.NewReader(randomReplay(seed)), &all); err != nil {
				fmt.Fprintf(&all, "error %v\n", err)
			}
		}
		for seed := uint64(1); seed <= 3; seed++ {
			fmt.Fprintf(&all, "== envoy %s seed %d\n", name, seed)
			envoyTraffic(t, name, seed, &all)
			fmt.Fprintf(&all, "== http %s seed %d\n", name, seed)
			httpTraffic(t, name, seed, &all)
		}
	}
	if err := os.WriteFile(out, all.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func randomReplay(seed uint64) string {
	r := rand.New(rand.NewPCG(seed, 1))
	limits := []string{
		`{"rate":4,"burst":2}`,
		`{"rate":5,"period":"10s","burst":20,"refill":"interval"}`,
		`{"algorithm":"fixed_window","rate":3,"period":"2s"}`,
		`{"algorithm":"sliding_window","rate":4,"period":"3s"}`,
		`{"rate":2,"burst":3,"max_reserved":2}`,
	}
	ops := []string{"take", "take", "take", "peek", "refund"}
	var b strings.Builder
	at := 0.0
	for range 200 {
		at += float64(r.IntN(700)) / 1000
		li := r.IntN(len(limits))
		cost := float64(r.IntN(7)) / 2
		fmt.Fprintf(&b, `{"at":%.3f,"op":%q,"key":"k%d","cost":%g,"limit":%s}`+"\n", at, ops[r.IntN(len(ops))], li, cost, limits[li])
	}
	return b.String()
}

const envoyConfig = `
domain: gold
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: team
    rate_limit: {unit: minute, requests_per_unit: 10}
    quota_mode: true
  - key: org
    rate_limit: {unit: second, requests_per_unit: 2}
    quota_mode: true
  - key: shadowed
    rate_limit: {unit: second, requests_per_unit: 1}
    shadow_mode: true
  - key: shadowq
    rate_limit: {unit: second, requests_per_unit: 1}
    shadow_mode: true
    quota_mode: true
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: zeroq
    rate_limit: {unit: second, requests_per_unit: 0}
    quota_mode: true
  - key: zeros
    rate_limit: {unit: second, requests_per_unit: 0}
    shadow_mode: true
  - key: free
    rate_limit: {unlimited: true}
  - key: win
    rate_limit: {unit: second, requests_per_unit: 4, algorithm: fixed_window}
  - key: named
    rate_limit: {name: old, unit: second, requests_per_unit: 2}
  - key: newer
    rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: old}]}
  - key: settle
    rate_limit: {unit: second, requests_per_unit: 5, settle: true}
`

func envoyTraffic(t *testing.T, storeName string, seed uint64, w *bytes.Buffer) {
	for _, opts := range []envoy.Options{{}, {Headers: envoy.Headers{Mode: envoy.HeadersEnvoy}, DynamicMetadata: true}, {Shadow: true}, {Quota: true}} {
		cfg, err := envoy.ParseWith(opts, envoy.File{Name: "gold.yaml", Data: []byte(envoyConfig)})
		if err != nil {
			t.Fatal(err)
		}
		st := teststores.Open(t, storeName)
		now := time.Unix(1_700_000_000, 0)
		var buf bytes.Buffer
		ev := &events{buf: &buf}
		svc := envoy.NewService(st, cfg, engine.WithClock(func() time.Time { return now }), engine.WithObserver(ev), engine.WithTimeout(teststores.Timeout))
		r := rand.New(rand.NewPCG(seed, 2))
		keys := []string{"user", "team", "org", "shadowed", "shadowq", "zero", "zeroq", "zeros", "free", "win", "named", "newer", "settle", "other"}
		fmt.Fprintf(w, "-- options %+v\n", opts)
		for i := range 120 {
			now = now.Add(time.Duration(r.IntN(600)) * time.Millisecond)
			req := &rlsv3.RateLimitRequest{Domain: "gold", HitsAddend: uint32(r.IntN(3))}
			for range 1 + r.IntN(3) {
				k := keys[r.IntN(len(keys))]
				d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: fmt.Sprint(r.IntN(2))}}}
				switch r.IntN(8) {
				case 0:
					d.HitsAddend = wrapperspb.UInt64(uint64(r.IntN(5)))
				case 1:
					d.IsNegativeHits = true
				case 2:
					d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: envoy.SettleKey, Value: "1"})
					d.HitsAddend = wrapperspb.UInt64(uint64(r.IntN(9)))
				}
				req.Descriptors = append(req.Descriptors, d)
			}
			buf.Reset()
			resp, err := svc.ShouldRateLimit(context.Background(), req)
			b, _ := protojson.Marshal(req)
			fmt.Fprintf(w, "%d %s\n", i, strings.ReplaceAll(string(b), " ", ""))
			if err != nil {
				fmt.Fprintf(w, "  error %v\n", err)
			} else {
				// protojson's output is not stable: reformat through
				// its compact form with map keys sorted.
				fmt.Fprintf(w, "  %s\n", stableJSON(resp))
			}
			w.Write(buf.Bytes())
		}
	}
}

func stableJSON(resp *rlsv3.RateLimitResponse) string {
	b, _ := protojson.MarshalOptions{}.Marshal(resp)
	s := string(b)
	s = strings.ReplaceAll(s, " ", "")
	return s
}

const httpRules = `{"rules": [
 {"name": "gold", "group": "plan", "limit_keys": ["header:x-key"], "match": {"header:x-plan": "gold"}, "algorithm_config": {"rps": 5, "burst": 8, "cost_source": "header:x-cost", "default_cost": 1}},
 {"name": "free", "group": "plan", "limit_keys": ["header:x-key"], "algorithm_config": {"rps": 2, "burst": 3, "cost_source": "header:x-cost", "default_cost": 1}},
 {"name": "win", "limit_keys": ["ip:address"], "algorithm": "fixed_window", "algorithm_config": {"rate": 6, "period": "5s"}},
 {"name": "slide", "limit_keys": ["header:x-key"], "algorithm": "sliding_window", "algorithm_config": {"rate": 4, "period": "3s"}},
 {"name": "slots", "limit_keys": ["header:x-key"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1, "lease_ttl": "30s"}},
 {"name": "shadow", "mode": "shadow", "limit_keys": ["global"], "algorithm_config": {"rps": 1, "burst": 2}},
 {"name": "fails", "limit_keys": ["ip:address"], "count_status": ["5xx"], "algorithm_config": {"rate": 2, "period": "10s"}},
 {"name": "used", "limit_keys": ["header:x-key"], "match": {"path": "/used"}, "cost_from_response": "header:x-used", "algorithm_config": {"rps": 3, "burst": 6}}
]}`

func httpTraffic(t *testing.T, storeName string, seed uint64, w *bytes.Buffer) {
	set, err := rules.Parse([]byte(httpRules), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	st := teststores.Open(t, storeName)
	now := time.Unix(1_700_000_000, 0)
	var buf bytes.Buffer
	ev := &events{buf: &buf}
	l := httplimit.New(st, set, engine.WithClock(func() time.Time { return now }), engine.WithObserver(ev), engine.WithTimeout(teststores.Timeout))
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u := r.Header.Get("x-give"); u != "" {
			w.Header().Set("x-used", u)
		}
		if r.Header.Get("x-fail") != "" {
			w.WriteHeader(500)
		}
		fmt.Fprint(w, "ok")
	}))
	r := rand.New(rand.NewPCG(seed, 3))
	for i := range 150 {
		now = now.Add(time.Duration(r.IntN(500)) * time.Millisecond)
		path := []string{"/", "/used", "/x"}[r.IntN(3)]
		req := httptest.NewRequest("GET", path, nil)
		req.RemoteAddr = fmt.Sprintf("10.0.0.%d:1234", r.IntN(2))
		req.Header.Set("x-key", fmt.Sprint("k", r.IntN(2)))
		if r.IntN(2) == 0 {
			req.Header.Set("x-plan", "gold")
		}
		switch r.IntN(5) {
		case 0:
			req.Header.Set("x-cost", fmt.Sprint(r.IntN(12)))
		case 1:
			req.Header.Set("x-cost", "junk")
		}
		if r.IntN(4) == 0 {
			req.Header.Set("x-fail", "1")
		}
		if r.IntN(2) == 0 {
			req.Header.Set("x-give", fmt.Sprint(r.IntN(9)))
		}
		buf.Reset()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var hs []string
		for k, v := range rec.Header() {
			hs = append(hs, k+": "+strings.Join(v, ","))
		}
		slices.Sort(hs)
		fmt.Fprintf(w, "%d %s %v -> %d %q %q\n", i, path, req.Header, rec.Code, hs, rec.Body.String())
		// Decision and settle events are reported in a fixed order.
		w.Write(buf.Bytes())
	}
}
