package testserver

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SentinelMaster is the name the Sentinels of a RedisSentinel monitor the
// master under.
const SentinelMaster = "drip"

// Failover timing of a RedisSentinel: a master that does not answer for
// SentinelDownAfter is down, and a failover that does not finish within
// SentinelFailoverTimeout is tried again. Both are far below the defaults
// (30 s, 3 min), so that a test's failover takes a second or two.
const (
	SentinelDownAfter       = 500 * time.Millisecond
	SentinelFailoverTimeout = 2 * time.Second
)

// RedisSentinel is a master, a replica and three Sentinels (quorum 2)
// monitoring them, all on loopback.
type RedisSentinel struct {
	Master, Replica *Redis
	Sentinels       []*Redis
	// tlsPort is each server's TLS port, when they serve TLS.
	tlsPort map[*Redis]int
}

// StartRedisSentinel starts a RedisSentinel of the test's own, stopped
// when the test ends, and waits until the replica is in sync and every
// Sentinel knows the master, the replica and the other Sentinels.
func StartRedisSentinel(t testing.TB) *RedisSentinel {
	t.Helper()
	return startRedisSentinel(t, "", "", "")
}

// StartRedisSentinelTLS is StartRedisSentinel with every server (master,
// replica, Sentinels) serving TLS with certFile and keyFile on a port of
// its own, and talking TLS to the others (trusting caFile): clients reach
// them all over TLS (URL). The plain ports stay, for the harness.
func StartRedisSentinelTLS(t testing.TB, caFile, certFile, keyFile string) *RedisSentinel {
	t.Helper()
	return startRedisSentinel(t, caFile, certFile, keyFile)
}

func startRedisSentinel(t testing.TB, caFile, certFile, keyFile string) *RedisSentinel {
	t.Helper()
	if err := RedisMissing(); err != nil {
		Missing(t, "redis: %v", err)
	}
	s, err := newRedisSentinel(t.TempDir(), caFile, certFile, keyFile)
	if s != nil {
		t.Cleanup(s.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// NewRedisSentinel starts a RedisSentinel in dir (plain TCP), for
// programs without a testing.TB (the load harness); the caller must Stop
// it.
func NewRedisSentinel(dir string) (*RedisSentinel, error) {
	if err := RedisMissing(); err != nil {
		return nil, err
	}
	s, err := newRedisSentinel(dir, "", "", "")
	if err != nil && s != nil {
		s.Stop()
		return nil, err
	}
	return s, err
}

// newRedisSentinel starts the servers of a RedisSentinel in dir; on an
// error it returns what it started, for the caller to stop.
func newRedisSentinel(dir, caFile, certFile, keyFile string) (*RedisSentinel, error) {
	s := &RedisSentinel{tlsPort: map[*Redis]int{}}
	tlsArgs := func(port int) []string {
		if certFile == "" {
			return nil
		}
		return []string{"--tls-port", strconv.Itoa(port), "--tls-cert-file", certFile, "--tls-key-file", keyFile,
			"--tls-ca-cert-file", caFile, "--tls-auth-clients", "no", "--tls-replication", "yes"}
	}
	launch := func(name string, extra ...string) (*Redis, error) {
		tp, err := freePort()
		if err != nil {
			return nil, err
		}
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		args := append([]string{"--repl-diskless-sync-delay", "0"}, tlsArgs(tp)...)
		if certFile != "" {
			args = append(args, "--replica-announce-port", strconv.Itoa(tp))
		}
		r, err := LaunchRedis(filepath.Join(dir, name), port, append(args, extra...)...)
		if err != nil {
			return nil, err
		}
		if certFile != "" {
			s.tlsPort[r] = tp
		}
		return r, nil
	}
	var err error
	if s.Master, err = launch("master"); err != nil {
		return s, err
	}
	if s.Replica, err = launch("replica", "--replicaof", "127.0.0.1", strconv.Itoa(s.port(s.Master))); err != nil {
		return s, err
	}
	for i := range 3 {
		port, err := freePort()
		if err != nil {
			return s, err
		}
		tp, err := freePort()
		if err != nil {
			return s, err
		}
		d := filepath.Join(dir, fmt.Sprintf("sentinel%d", i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return s, err
		}
		conf := filepath.Join(d, "sentinel.conf")
		text := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
dir %s
logfile %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s %d
sentinel parallel-syncs %s 1
`, port, d, filepath.Join(d, "redis.log"), SentinelMaster, s.port(s.Master),
			SentinelMaster, SentinelDownAfter.Milliseconds(), SentinelMaster, SentinelFailoverTimeout.Milliseconds(), SentinelMaster)
		if certFile != "" {
			a := tlsArgs(tp)
			for j := 0; j < len(a); j += 2 {
				text += strings.TrimPrefix(a[j], "--") + " " + a[j+1] + "\n"
			}
			text += fmt.Sprintf("sentinel announce-port %d\n", tp)
		}
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return s, err
		}
		bin, _ := exec.LookPath("redis-server")
		r := &Redis{Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port), dir: d, args: []string{bin, conf, "--sentinel"}}
		if err := r.Start(); err != nil {
			return s, err
		}
		if certFile != "" {
			s.tlsPort[r] = tp
		}
		s.Sentinels = append(s.Sentinels, r)
	}
	return s, s.WaitReady(s.Master, 30*time.Second)
}

// port is the port clients reach r at: its TLS port if it has one.
func (s *RedisSentinel) port(r *Redis) int {
	if p, ok := s.tlsPort[r]; ok {
		return p
	}
	return r.Port
}

// ClientAddr is the address clients reach r at: its TLS port if it has
// one.
func (s *RedisSentinel) ClientAddr(r *Redis) string { return "127.0.0.1:" + strconv.Itoa(s.port(r)) }

// URL is the redis+sentinel:// URL of the Sentinels and the master's name
// (rediss+sentinel:// with TLS, without the CA: add tls_ca_file).
func (s *RedisSentinel) URL() string {
	addrs := make([]string, len(s.Sentinels))
	for i, r := range s.Sentinels {
		addrs[i] = s.ClientAddr(r)
	}
	scheme := "redis+sentinel://"
	if len(s.tlsPort) > 0 {
		scheme = "rediss+sentinel://"
	}
	return scheme + strings.Join(addrs, ",") + "/" + SentinelMaster
}

// MasterAddr is the master's address as the running Sentinels agree on
// it, or "" while they do not.
func (s *RedisSentinel) MasterAddr() string {
	addr := ""
	for _, r := range s.Sentinels {
		if !r.Running() {
			continue
		}
		out, err := r.cli("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster)
		f := strings.Fields(out)
		if err != nil || len(f) != 2 {
			return ""
		}
		a := f[0] + ":" + f[1]
		if addr != "" && a != addr {
			return ""
		}
		addr = a
	}
	return addr
}

// WaitReady waits until every running Sentinel names master as the
// master and sees two other Sentinels, and master has a replica in sync
// (when any other data server runs).
func (s *RedisSentinel) WaitReady(master *Redis, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok := s.MasterAddr() == s.ClientAddr(master)
		if !ok {
			last = "sentinels name " + s.MasterAddr() + ", want " + s.ClientAddr(master)
		}
		for _, r := range s.Sentinels {
			if !ok || !r.Running() {
				continue
			}
			out, err := r.cli("SENTINEL", "MASTER", SentinelMaster)
			f := strings.Fields(out)
			v := map[string]string{}
			for i := 0; i+1 < len(f); i += 2 {
				v[f[i]] = f[i+1]
			}
			if err != nil || v["num-other-sentinels"] != "2" || v["num-slaves"] == "0" || strings.Contains(v["flags"], "down") {
				ok, last = false, r.Addr+": "+out
			}
		}
		if ok {
			out, err := master.cli("INFO", "replication")
			if err != nil || !strings.Contains(out, "role:master") || !strings.Contains(out, "state=online") {
				ok, last = false, master.Addr+": "+out
			}
		}
		if ok {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("testserver: sentinel setup not ready after %v: %s", timeout, last)
}

// Stop stops every server.
func (s *RedisSentinel) Stop() {
	for _, r := range append([]*Redis{s.Master, s.Replica}, s.Sentinels...) {
		if r != nil {
			r.Stop()
		}
	}
}
