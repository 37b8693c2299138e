// Command procbench measures servers as separate processes, by the CPU
// their processes spend per call (utime + stime from /proc), beside a
// peer, with one load generator in this process:
//
//	cd bench && go run ./procbench -suite envoy   # Envoy RLS: drip serve on Redis, envoyproxy/ratelimit (local cache on), drip serve on memory
//	cd bench && go run ./procbench -suite envoy -leased   # and drip serve --leased on Redis
//	cd bench && go run ./procbench -suite envoy -only drip-memory,envoyproxy-ratelimit,trivial-rls   # the gRPC floor: a service that answers OK and keeps nothing
//	cd bench && go run ./procbench -suite api     # decision API: drip serve on memory, a trivial Go JSON server
//
// -drip takes a drip binary (else it is built from this repository), so
// that two builds can be compared in one run: -drip /tmp/old,/tmp/new
// measures each as a system of its own, side by side.
//
// Envoy: every system reads the same configuration (a million a second
// for an address and a path under it, so those calls are allowed and
// write; 10 a second for one hot address, so that key's calls are over
// its limit); the load is 64 callers on 8 gRPC connections, each caller
// sending its next call as soon as the last returns. envoyproxy/ratelimit
// is its own runner (src/service_cmd, built from its module) with
// LOCAL_CACHE_SIZE_IN_BYTES set (its over-limit keys answered from
// memory), statsd off; drip serve runs as it comes (--store redis://...).
// CPU per call counts the server's process plus redis-server's.
//
// API: POST /v1/take of {"key": "user:N", "limit": {"rate": ..., "burst":
// ...}} over 100,000 keys to drip serve on the memory store, and the same
// bodies to a trivial server (this program run with -trivial: decode the
// body with encoding/json, encode a small answer); the load is N
// keep-alive HTTP/1.1 connections, one caller each.
//
// Systems alternate within a round (the first goes last in the next);
// each phase runs -phase long; the median over -rounds of each figure is
// printed, and the ratios of the rounds, taken round by round.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/driplimit/drip/internal/testkit/testserver"
)

const envoyConfig = `domain: edge
descriptors:
  - key: remote_address
    value: 10.255.255.255
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 1000000
    descriptors:
      - key: path
        rate_limit:
          unit: second
          requests_per_unit: 1000000
`

func main() {
	suite := flag.String("suite", "envoy", "envoy or api")
	rounds := flag.Int("rounds", 3, "rounds")
	phase := flag.Duration("phase", 10*time.Second, "length of one system's phase")
	drips := flag.String("drip", "", "drip binaries, comma-separated (default: built from this repository)")
	only := flag.String("only", "", "comma-separated systems to run (default all)")
	workloads := flag.String("workloads", "", "comma-separated workloads (default all)")
	leased := flag.Bool("leased", false, "envoy: also run each drip on Redis with --leased (drip-leased)")
	callers := flag.Int("callers", 64, "callers (envoy: on 8 connections; api: one connection each)")
	trivial := flag.String("trivial", "", "serve the trivial JSON server on this address (internal)")
	trivialRLSAddr := flag.String("trivial-rls", "", "serve the trivial Envoy rate limit service on this address (internal)")
	peer := flag.String("peer", "", "serve envoyproxy/ratelimit on this address (internal)")
	peerRedis := flag.String("redis", "", "the peer's Redis (internal)")
	peerConfig := flag.String("config", "", "the peer's configuration file (internal)")
	flag.Parse()
	if *peer != "" {
		servePeer(*peer, *peerRedis, *peerConfig)
		return
	}
	if *trivial != "" {
		serveTrivial(*trivial)
		return
	}
	if *trivialRLSAddr != "" {
		serveTrivialRLS(*trivialRLSAddr)
		return
	}
	dir, err := os.MkdirTemp("", "procbench-")
	check(err)
	defer os.RemoveAll(dir)
	var bins []string
	if *drips == "" {
		bin := filepath.Join(dir, "drip")
		build(bin, "./cmd/drip", "..") // the repository's module, from bench/
		bins = []string{bin}
	} else {
		bins = strings.Split(*drips, ",")
	}
	var load1 []string
	load1 = append(load1, loadavg())
	switch *suite {
	case "envoy":
		runEnvoy(dir, bins, *rounds, *phase, *callers, split(*only), split(*workloads), *leased)
	case "api":
		runAPI(dir, bins, *rounds, *phase, *callers, split(*only))
	default:
		check(fmt.Errorf("unknown suite %q", *suite))
	}
	load1 = append(load1, loadavg())
	fmt.Printf("load average before, after: %s; %s\n", load1[0], load1[1])
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "procbench:", err)
		os.Exit(1)
	}
}

func build(out, pkg, dir string) {
	out, err := filepath.Abs(out)
	check(err)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	check(cmd.Run())
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// cpu is the CPU a process has used (utime + stime), from /proc.
func cpu(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	check(err)
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// fields after the name: state(0) ... utime(11) stime(12)
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * time.Second / 100 // USER_HZ
}

// proc is a server process of a system.
type proc struct {
	cmd  *exec.Cmd
	done <-chan struct{}
}

func start(dir, name string, cmd *exec.Cmd) *proc {
	log, err := os.Create(filepath.Join(dir, name+".log"))
	check(err)
	cmd.Stdout, cmd.Stderr = log, log
	done, err := testserver.Start(cmd)
	check(err)
	return &proc{cmd: cmd, done: done}
}

func (p *proc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

func port() string {
	p, err := testserver.LoopbackPort()
	check(err)
	return "127.0.0.1:" + strconv.Itoa(p)
}

func waitTCP(addr string, p *proc) {
	for range 300 {
		select {
		case <-p.done:
			check(fmt.Errorf("%s exited", p.cmd.Path))
		default:
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	check(fmt.Errorf("%s: no listener on %s", p.cmd.Path, addr))
}

// phase is one system's phase of one workload.
type phase struct {
	perSec, p50, cpu, redisCPU float64 // calls/s, µs, µs per call (server), µs per call (redis)
	errs                       int64
}

func (p phase) total() float64 { return p.cpu + p.redisCPU }

// system is one server under test.
type system struct {
	name  string
	pid   func() int
	redis int // pid of its redis-server, 0 if none
	// run drives the system with the load for d.
	run func(workload string, d time.Duration) (calls, errs int64, lat []time.Duration)
}

// loadFunc drives a system with a workload for d.
type loadFunc = func(workload string, d time.Duration) (calls, errs int64, lat []time.Duration)

// selfSystem is this program run as the server of its flag -name on a
// port of its own (a trivial server), driven by load.
func selfSystem(dir, name string, load func(addr string) loadFunc) (*proc, system) {
	self, err := os.Executable()
	check(err)
	addr := port()
	p := start(dir, name, exec.Command(self, "-"+name, addr))
	waitTCP(addr, p)
	return p, system{name: name, pid: func() int { return p.cmd.Process.Pid }, run: load(addr)}
}

func measure(s system, workload string, d time.Duration) phase {
	pid := s.pid()
	c0, r0 := cpu(pid), time.Duration(0)
	if s.redis != 0 {
		r0 = cpu(s.redis)
	}
	t0 := time.Now()
	calls, errs, lat := s.run(workload, d)
	el := time.Since(t0)
	c1 := cpu(pid)
	var r1 time.Duration
	if s.redis != 0 {
		r1 = cpu(s.redis)
	}
	slices.Sort(lat)
	p := phase{perSec: float64(calls) / el.Seconds(), errs: errs}
	if len(lat) > 0 {
		p.p50 = float64(lat[len(lat)/2].Microseconds())
	}
	if calls > 0 {
		p.cpu = float64((c1 - c0).Microseconds()) / float64(calls)
		p.redisCPU = float64((r1 - r0).Microseconds()) / float64(calls)
	}
	return p
}

func median(x []float64) float64 {
	x = slices.Clone(x)
	slices.Sort(x)
	return x[len(x)/2]
}

// rounds runs every system on workload, alternating, and prints.
func rounds(systems []system, workload string, n int, d time.Duration) {
	res := make([][]phase, len(systems))
	for r := range n {
		for k := range systems {
			i := (k + r) % len(systems)
			p := measure(systems[i], workload, d)
			res[i] = append(res[i], p)
			fmt.Printf("  %s round %d %-22s %8.0f calls/s  p50 %6.0f µs  cpu %6.1f + redis %5.1f = %6.1f µs/call  errors %d\n",
				workload, r, systems[i].name, p.perSec, p.p50, p.cpu, p.redisCPU, p.total(), p.errs)
		}
	}
	fmt.Printf("%s (median of %d rounds):\n", workload, n)
	for i, s := range systems {
		get := func(f func(phase) float64) float64 {
			x := make([]float64, len(res[i]))
			for j, p := range res[i] {
				x[j] = f(p)
			}
			return median(x)
		}
		fmt.Printf("  %-22s %8.0f calls/s  p50 %6.0f µs  cpu/call %6.1f µs (server %5.1f, redis %4.1f)",
			s.name, get(func(p phase) float64 { return p.perSec }), get(func(p phase) float64 { return p.p50 }),
			get(phase.total), get(func(p phase) float64 { return p.cpu }), get(func(p phase) float64 { return p.redisCPU }))
		if i > 0 {
			x := make([]float64, n)
			for j := range x {
				x[j] = res[i][j].total() / res[0][j].total()
			}
			fmt.Printf("  cpu/call vs %s: %.2fx (rounds %s)", systems[0].name, median(x), fmtRange(x))
		}
		fmt.Println()
	}
}

func fmtRange(x []float64) string {
	return fmt.Sprintf("%.2f-%.2f", slices.Min(x), slices.Max(x))
}

func want(only []string, name string) bool { return len(only) == 0 || slices.Contains(only, name) }

// ---- Envoy RLS ----

func runEnvoy(dir string, bins []string, n int, d time.Duration, callers int, only, wls []string, leased bool) {
	cfgDir := filepath.Join(dir, "runtime", "current", "ratelimit", "config")
	check(os.MkdirAll(cfgDir, 0o755))
	rulesFile := filepath.Join(cfgDir, "edge.yaml")
	check(os.WriteFile(rulesFile, []byte(envoyConfig), 0o644))

	rport, err := testserver.LoopbackPort()
	check(err)
	redis, err := testserver.LaunchRedis(filepath.Join(dir, "redis"), rport)
	check(err)
	defer redis.Stop()
	info, err := redis.Cli("INFO", "server")
	check(err)
	var redisPid int
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "process_id:"); ok {
			redisPid, _ = strconv.Atoi(v)
		}
	}
	if redisPid == 0 {
		check(errors.New("no process_id in redis INFO"))
	}

	var systems []system
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	addDrip := func(name, bin, store string, redisPid int, args ...string) {
		if !want(only, name) {
			return
		}
		addr := port()
		p := start(dir, name, exec.Command(bin, append([]string{"serve", "--listen", port(), "--admin-listen", "off",
			"--grpc-listen", addr, "--store", store, "--rules", rulesFile}, args...)...))
		procs = append(procs, p)
		waitTCP(addr, p)
		systems = append(systems, system{name: name, pid: func() int { return p.cmd.Process.Pid }, redis: redisPid, run: envoyLoad(addr, callers)})
	}
	for i, bin := range bins {
		suffix := ""
		if len(bins) > 1 {
			suffix = fmt.Sprintf("#%d", i)
		}
		addDrip("drip-redis"+suffix, bin, redis.URL(), redisPid)
		if leased {
			addDrip("drip-leased"+suffix, bin, redis.URL(), redisPid, "--leased")
		}
	}
	if want(only, "envoyproxy-ratelimit") {
		self, err := os.Executable()
		check(err)
		addr := port()
		p := start(dir, "envoyproxy-ratelimit", exec.Command(self, "-peer", addr, "-redis", redis.Addr, "-config", rulesFile))
		procs = append(procs, p)
		waitTCP(addr, p)
		systems = append(systems, system{name: "envoyproxy-ratelimit", pid: func() int { return p.cmd.Process.Pid }, redis: redisPid, run: envoyLoad(addr, callers)})
	}
	for i, bin := range bins {
		suffix := ""
		if len(bins) > 1 {
			suffix = fmt.Sprintf("#%d", i)
		}
		addDrip("drip-memory"+suffix, bin, "memory", 0)
	}
	if want(only, "trivial-rls") {
		p, s := selfSystem(dir, "trivial-rls", func(addr string) loadFunc { return envoyLoad(addr, callers) })
		procs, systems = append(procs, p), append(systems, s)
	}
	for _, w := range []string{"100k-keys", "hot-key", "2-descriptors"} {
		if want(wls, w) {
			for _, s := range systems { // warm up
				s.run(w, time.Second)
			}
			rounds(systems, w, n, d)
		}
	}
}

var envoyReqs = map[string][]*rlsv3.RateLimitRequest{
	"100k-keys":     envoyRequests(100_000, 1),
	"hot-key":       {{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.255.255.255"}}}}}},
	"2-descriptors": envoyRequests(100_000, 2),
}

func envoyRequests(keys, descriptors int) []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, keys)
	for i := range reqs {
		ip := &ratelimitv3.RateLimitDescriptor_Entry{Key: "remote_address", Value: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}
		ds := []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{ip}}}
		if descriptors == 2 {
			ds = append(ds, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{ip, {Key: "path", Value: "/api/orders"}}})
		}
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds}
	}
	return reqs
}

func envoyLoad(addr string, callers int) func(string, time.Duration) (int64, int64, []time.Duration) {
	const conns = 8
	clients := make([]rlsv3.RateLimitServiceClient, conns)
	for i := range clients {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		check(err)
		clients[i] = rlsv3.NewRateLimitServiceClient(c)
	}
	return func(workload string, d time.Duration) (int64, int64, []time.Duration) {
		reqs := envoyReqs[workload]
		hot := workload == "hot-key"
		var calls, errs atomic.Int64
		lat := make([][]time.Duration, callers)
		var wg sync.WaitGroup
		deadline := time.Now().Add(d)
		for w := range callers {
			wg.Go(func() {
				client := clients[w%conns]
				mine := make([]time.Duration, 0, 1<<14)
				for i := w * 7919; time.Now().Before(deadline); i += 104729 {
					t0 := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					resp, err := client.ShouldRateLimit(ctx, reqs[i%len(reqs)])
					cancel()
					mine = append(mine, time.Since(t0))
					if err != nil || (resp.OverallCode != rlsv3.RateLimitResponse_OK && !hot) {
						if errs.Add(1) == 1 {
							fmt.Fprintln(os.Stderr, "first error:", err, resp.GetOverallCode())
						}
						continue
					}
					calls.Add(1)
				}
				lat[w] = mine
			})
		}
		wg.Wait()
		return calls.Load(), errs.Load(), slices.Concat(lat...)
	}
}

// ---- decision API ----

func runAPI(dir string, bins []string, n int, d time.Duration, callers int, only []string) {
	var systems []system
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	for i, bin := range bins {
		name := "drip-api"
		if len(bins) > 1 {
			name += fmt.Sprintf("#%d", i)
		}
		if !want(only, name) {
			continue
		}
		addr := port()
		p := start(dir, name, exec.Command(bin, "serve", "--listen", addr, "--admin-listen", "off", "--store", "memory"))
		procs = append(procs, p)
		waitTCP(addr, p)
		systems = append(systems, system{name: name, pid: func() int { return p.cmd.Process.Pid }, run: httpLoad(addr, callers)})
	}
	if want(only, "trivial") {
		p, s := selfSystem(dir, "trivial", func(addr string) loadFunc { return httpLoad(addr, callers) })
		procs, systems = append(procs, p), append(systems, s)
	}
	for _, s := range systems {
		s.run("", time.Second)
	}
	rounds(systems, "decision-api", n, d)
}

var apiBodies = func() [][]byte {
	b := make([][]byte, 100_000)
	for i := range b {
		b[i] = fmt.Appendf(nil, `{"key": "user:%d", "limit": {"rate": 1000000, "burst": 1000000}}`, i)
	}
	return b
}()

// httpLoad drives addr with callers keep-alive HTTP/1.1 connections, each
// sending its next request as soon as the last answer is read.
func httpLoad(addr string, callers int) func(string, time.Duration) (int64, int64, []time.Duration) {
	return func(_ string, d time.Duration) (int64, int64, []time.Duration) {
		var calls, errs atomic.Int64
		lat := make([][]time.Duration, callers)
		var wg sync.WaitGroup
		deadline := time.Now().Add(d)
		for w := range callers {
			wg.Go(func() {
				conn, err := net.Dial("tcp", addr)
				check(err)
				defer conn.Close()
				br := bufio.NewReader(conn)
				var req []byte
				mine := make([]time.Duration, 0, 1<<14)
				for i := w * 7919; time.Now().Before(deadline); i += 104729 {
					body := apiBodies[i%len(apiBodies)]
					req = fmt.Appendf(req[:0], "POST /v1/take HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", addr, len(body))
					req = append(req, body...)
					t0 := time.Now()
					if _, err := conn.Write(req); err != nil {
						check(err)
					}
					resp, err := http.ReadResponse(br, nil)
					check(err)
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					check(err)
					mine = append(mine, time.Since(t0))
					if resp.StatusCode != http.StatusOK {
						if errs.Add(1) == 1 {
							fmt.Fprintln(os.Stderr, "first error:", resp.Status)
						}
						continue
					}
					calls.Add(1)
				}
				lat[w] = mine
			})
		}
		wg.Wait()
		return calls.Load(), errs.Load(), slices.Concat(lat...)
	}
}

// serveTrivial is the trivial JSON server: it decodes the body (a key and
// a limit) and answers a fixed decision, as small a server of JSON as
// net/http makes.
func serveTrivial(addr string) {
	type limit struct {
		Rate  float64 `json:"rate"`
		Burst float64 `json:"burst"`
	}
	type request struct {
		Key   string `json:"key"`
		Limit limit  `json:"limit"`
	}
	type answer struct {
		Allowed   bool    `json:"allowed"`
		Remaining float64 `json:"remaining"`
	}
	http.HandleFunc("POST /v1/take", func(w http.ResponseWriter, r *http.Request) {
		var req request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Key == "" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		var buf bytes.Buffer
		json.NewEncoder(&buf).Encode(answer{Allowed: true, Remaining: req.Limit.Burst - 1})
		w.Header().Set("Content-Type", "application/json")
		w.Write(buf.Bytes())
	})
	check(http.ListenAndServe(addr, nil))
}
