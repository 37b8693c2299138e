package testserver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Redis is a redis-server process on a loopback port, with its working
// directory in a temporary directory and no persistence (a restart starts
// empty, like a failed-over node that lost its data).
type Redis struct {
	Port int
	Addr string // 127.0.0.1:Port
	dir  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done <-chan struct{}
}

// LaunchRedis starts redis-server on port with its files in dir, plus
// extra arguments, and waits until it answers PING. It needs no
// testing.TB, so a TestMain can share one server across a test binary;
// call Stop when done.
func LaunchRedis(dir string, port int, extra ...string) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	r := &Redis{Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir}
	r.args = append([]string{bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--protected-mode", "no", "--logfile", filepath.Join(dir, "redis.log"),
	}, extra...)
	if err := r.Start(); err != nil {
		return nil, err
	}
	return r, nil
}

// Start starts the server again after Kill or Stop, on the same port and
// with the same arguments, and waits until it answers.
func (r *Redis) Start() error { return retryBind(r.start) }

func (r *Redis) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return errors.New("testserver: redis already running")
	}
	cmd := exec.Command(r.args[0], r.args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	done, err := start(cmd)
	if err != nil {
		return err
	}
	r.cmd, r.done = cmd, done
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			r.cmd = nil
			return fmt.Errorf("testserver: redis-server on port %d exited at start: %s", r.Port, tail(filepath.Join(r.dir, "redis.log")))
		default:
		}
		if out, err := r.cli("PING"); err == nil && strings.TrimSpace(out) == "PONG" {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("testserver: redis-server on port %d did not answer: %s", r.Port, tail(filepath.Join(r.dir, "redis.log")))
}

// Kill stops the server at once (SIGKILL), as a crash would.
func (r *Redis) Kill() { r.signal(syscall.SIGKILL) }

// Stop stops the server (SIGTERM). It is safe to call more than once.
func (r *Redis) Stop() { r.signal(syscall.SIGTERM) }

func (r *Redis) signal(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Signal(sig)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		r.cmd.Process.Kill()
		<-r.done
	}
	r.cmd = nil
}

// Pause stops the process where it is (SIGSTOP): connections are still
// accepted by the kernel, but nothing answers until Resume.
func (r *Redis) Pause() error { return r.send(syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (r *Redis) Resume() error { return r.send(syscall.SIGCONT) }

func (r *Redis) send(sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return errors.New("testserver: redis not running")
	}
	return r.cmd.Process.Signal(sig)
}

// Running reports whether the process is up.
func (r *Redis) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd != nil
}

// Log is the end of the server's log file.
func (r *Redis) Log() string { return tail(filepath.Join(r.dir, "redis.log")) }

// URL is redis://Addr.
func (r *Redis) URL() string { return "redis://" + r.Addr }

// Cli runs redis-cli against the server and returns its output.
func (r *Redis) Cli(args ...string) (string, error) { return r.cli(args...) }

func (r *Redis) cli(args ...string) (string, error) {
	out, err := exec.Command("redis-cli", append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(r.Port)}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("redis-cli %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// RedisMissing reports whether redis-server or redis-cli is missing, and
// why.
func RedisMissing() error {
	for _, b := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(b); err != nil {
			return err
		}
	}
	return nil
}

// StartRedis starts a server of the test's own, stopped when the test
// ends. Fault tests use it to kill and restart a server. A missing
// redis-server skips the test, or fails it under CI=true. extra are more
// redis-server arguments.
func StartRedis(t testing.TB, extra ...string) *Redis {
	t.Helper()
	if err := RedisMissing(); err != nil {
		Missing(t, "redis: %v", err)
	}
	r, err := LaunchRedis(t.TempDir(), FreePort(t, 0), extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// redisFreePort is FreePort without a testing.TB, for TestMain.
func redisFreePort(max int) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if max == 0 || port <= max {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free port at most %d", max)
}

// distinctPorts is n ports of redisFreePort, all different: each one's
// listener stays open until all are picked.
func distinctPorts(n, max int) ([]int, error) {
	var ports []int
	for try := 0; len(ports) < n; try++ {
		if try == 100*n {
			return nil, fmt.Errorf("no %d free ports at most %d", n, max)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		if port := l.Addr().(*net.TCPAddr).Port; port <= max {
			ports = append(ports, port)
		}
	}
	return ports, nil
}

var redisShared struct {
	mu      sync.Mutex
	redis   *Redis
	cluster *RedisCluster
	dirs    []string
	err     error
	cerr    error
}

// SharedRedisURL is the URL of one Redis server shared by every test of
// the binary: DRIP_TEST_REDIS_URL when set, or a server started on first
// use. Tests must keep to keys of their own. Call StopShared from
// TestMain.
func SharedRedisURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("DRIP_TEST_REDIS_URL"); u != "" {
		return u
	}
	if err := RedisMissing(); err != nil {
		Missing(t, "redis: %v", err)
	}
	redisShared.mu.Lock()
	defer redisShared.mu.Unlock()
	if redisShared.redis == nil && redisShared.err == nil {
		redisShared.redis, redisShared.err = launchTemp()
	}
	if redisShared.err != nil {
		t.Fatal(redisShared.err)
	}
	return redisShared.redis.URL()
}

func launchTemp() (*Redis, error) {
	dir, err := os.MkdirTemp("", "drip-redis-")
	if err != nil {
		return nil, err
	}
	redisShared.dirs = append(redisShared.dirs, dir)
	port, err := redisFreePort(0)
	if err != nil {
		return nil, err
	}
	return LaunchRedis(dir, port)
}

// SharedRedisClusterURL is the URL of one Redis Cluster (three masters,
// each with a replica) shared by every test of the binary:
// DRIP_TEST_REDIS_CLUSTER when set, or a cluster started on first use.
func SharedRedisClusterURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("DRIP_TEST_REDIS_CLUSTER"); u != "" {
		return u
	}
	if err := RedisMissing(); err != nil {
		Missing(t, "redis: %v", err)
	}
	redisShared.mu.Lock()
	defer redisShared.mu.Unlock()
	if redisShared.cluster == nil && redisShared.cerr == nil {
		dir, err := os.MkdirTemp("", "drip-redis-cluster-")
		if err != nil {
			t.Fatal(err)
		}
		redisShared.dirs = append(redisShared.dirs, dir)
		redisShared.cluster, redisShared.cerr = LaunchRedisCluster(dir, 3, 1)
	}
	if redisShared.cerr != nil {
		t.Fatal(redisShared.cerr)
	}
	return redisShared.cluster.URL()
}

// StopShared stops the shared servers and removes their files. Call it
// from TestMain after m.Run.
func StopShared() {
	redisShared.mu.Lock()
	defer redisShared.mu.Unlock()
	if redisShared.redis != nil {
		redisShared.redis.Stop()
	}
	if redisShared.cluster != nil {
		redisShared.cluster.Stop()
	}
	for _, d := range redisShared.dirs {
		os.RemoveAll(d)
	}
	redisShared.redis, redisShared.cluster, redisShared.dirs = nil, nil, nil
}

// RedisCluster is a Redis Cluster of redis-server processes on loopback
// ports, created with redis-cli --cluster create.
type RedisCluster struct {
	Nodes []*Redis
}

// clusterNodeTimeout is short so that a replica takes over a killed
// master within a couple of seconds.
const clusterNodeTimeout = "1000"

// LaunchRedisCluster starts masters*(1+replicas) nodes with their files
// under dir, creates the cluster, and waits until every node reports
// cluster_state:ok. Ports stay at most 55535: a node's bus port is its
// port + 10000.
func LaunchRedisCluster(dir string, masters, replicas int) (*RedisCluster, error) {
	// The nodes start at once, on ports picked apart from each other
	// first: each takes a moment to answer PING, which on a loaded machine
	// added up to seconds for six in turn.
	c := &RedisCluster{Nodes: make([]*Redis, masters*(1+replicas))}
	ports, err := distinctPorts(len(c.Nodes), 55535)
	if err != nil {
		return nil, err
	}
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i := range c.Nodes {
		wg.Go(func() {
			var r *Redis
			var err error
			port := ports[i]
			for try := 0; try < 5; try++ {
				if try > 0 {
					if port, err = redisFreePort(55535); err != nil {
						break
					}
				}
				nd := filepath.Join(dir, strconv.Itoa(i))
				r, err = LaunchRedis(nd, port,
					"--cluster-enabled", "yes",
					"--cluster-config-file", filepath.Join(nd, "nodes.conf"),
					"--cluster-node-timeout", clusterNodeTimeout,
					// Replicas sync at once (the default waits 5 s to
					// batch them), so a master killed early has a
					// replica to fail over to.
					"--repl-diskless-sync-delay", "0")
				if err == nil {
					break
				}
				os.RemoveAll(nd)
			}
			c.Nodes[i], errs[i] = r, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Nodes = slices.DeleteFunc(c.Nodes, func(r *Redis) bool { return r == nil })
		c.Stop()
		return nil, err
	}
	var addrs []string
	for _, r := range c.Nodes {
		addrs = append(addrs, r.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %v: %s", err, out)
	}
	if err := c.WaitOK(30 * time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// URL names the first node, and the others as ?addr= parameters.
func (c *RedisCluster) URL() string {
	var b strings.Builder
	b.WriteString("redis://" + c.Nodes[0].Addr)
	for i, n := range c.Nodes[1:] {
		if i == 0 {
			b.WriteString("?addr=")
		} else {
			b.WriteString("&addr=")
		}
		b.WriteString(n.Addr)
	}
	return b.String()
}

// Stop stops every node.
func (c *RedisCluster) Stop() {
	for _, n := range c.Nodes {
		n.Stop()
	}
}

// WaitOK waits until every running node reports cluster_state:ok and
// agrees on the masters of all slots, and every running replica is in
// sync with its master.
func (c *RedisCluster) WaitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok := true
		for _, n := range c.Nodes {
			if !n.Running() {
				continue
			}
			out, err := n.cli("CLUSTER", "INFO")
			if err != nil || !strings.Contains(out, "cluster_state:ok") {
				ok, last = false, n.Addr+": "+out
				break
			}
			out, err = n.cli("INFO", "replication")
			if err != nil || (strings.Contains(out, "role:slave") && !strings.Contains(out, "master_link_status:up")) {
				ok, last = false, n.Addr+": replica not in sync: "+out
				break
			}
		}
		if ok {
			if _, err := c.masters(); err == nil {
				return nil
			} else {
				last = err.Error()
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("testserver: cluster not ok after %v: %s", timeout, last)
}

// MasterOf returns the running node that serves slot as a master, as the
// running nodes agree.
func (c *RedisCluster) MasterOf(slot uint16) (*Redis, error) {
	ms, err := c.masters()
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if m.from <= int(slot) && int(slot) <= m.to {
			return m.node, nil
		}
	}
	return nil, fmt.Errorf("testserver: no master for slot %d", slot)
}

// SlotMap returns, for every slot, the running node that serves it as a
// master, as the running nodes agree.
func (c *RedisCluster) SlotMap() ([]*Redis, error) {
	ms, err := c.masters()
	if err != nil {
		return nil, err
	}
	m := make([]*Redis, 16384)
	for _, r := range ms {
		for s := r.from; s <= r.to; s++ {
			m[s] = r.node
		}
	}
	return m, nil
}

type slotRange struct {
	from, to int
	node     *Redis
}

// masters reads CLUSTER NODES from every running node and returns the
// slot ranges of the masters, if they agree and all masters are running.
func (c *RedisCluster) masters() ([]slotRange, error) {
	var want string
	var ranges []slotRange
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		out, err := n.cli("CLUSTER", "NODES")
		if err != nil {
			return nil, err
		}
		var rs []slotRange
		var sig []string
		sc := bufio.NewScanner(bytes.NewReader([]byte(out)))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 8 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
				continue
			}
			addr := f[1]
			if i := strings.IndexByte(addr, '@'); i >= 0 {
				addr = addr[:i]
			}
			var node *Redis
			for _, m := range c.Nodes {
				if m.Addr == addr {
					node = m
				}
			}
			for _, s := range f[8:] {
				if strings.HasPrefix(s, "[") {
					continue // a slot being migrated
				}
				from, to, _ := strings.Cut(s, "-")
				a, err1 := strconv.Atoi(from)
				b := a
				var err2 error
				if to != "" {
					b, err2 = strconv.Atoi(to)
				}
				if err1 != nil || err2 != nil {
					return nil, fmt.Errorf("bad slot range %q", s)
				}
				if node == nil || !node.Running() {
					return nil, fmt.Errorf("slots %s on %s, which is down", s, addr)
				}
				rs = append(rs, slotRange{a, b, node})
				sig = append(sig, addr+":"+s)
			}
		}
		slots := 0
		for _, r := range rs {
			slots += r.to - r.from + 1
		}
		if slots != 16384 {
			return nil, fmt.Errorf("%s sees %d slots served", n.Addr, slots)
		}
		joined := strings.Join(sortStrings(sig), ",")
		if want == "" {
			want, ranges = joined, rs
		} else if joined != want {
			return nil, errors.New("nodes disagree on the masters")
		}
	}
	return ranges, nil
}

func sortStrings(s []string) []string {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s
}
