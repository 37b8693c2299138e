package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/driplimit/drip/internal/testkit/testserver"
)

// child is a process of the harness's own (drip serve, a busy loop),
// started as testserver starts its servers: with Pdeathsig, so a harness
// that dies takes it along.
type child struct {
	cmd  *exec.Cmd
	done <-chan struct{}
}

func startChild(cmd *exec.Cmd) (*child, error) {
	done, err := testserver.Start(cmd)
	if err != nil {
		return nil, err
	}
	return &child{cmd: cmd, done: done}, nil
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop sends sig, then SIGKILL if the process has not exited within 5 s,
// and waits for it.
func (c *child) stop(sig syscall.Signal) {
	if c.exited() {
		return
	}
	c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
		return
	case <-time.After(5 * time.Second):
	}
	c.cmd.Process.Kill()
	<-c.done
}

// busyLoops starts n shell loops that spin on the CPU until stopped.
func busyLoops(n int) (stop func(), err error) {
	var cs []*child
	stop = func() {
		for _, c := range cs {
			c.stop(syscall.SIGKILL)
		}
	}
	for range n {
		c, err := startChild(exec.Command("sh", "-c", "while :; do :; done"))
		if err != nil {
			stop()
			return nil, err
		}
		cs = append(cs, c)
	}
	return stop, nil
}

// storeEnv is one store's servers, started by internal/testserver.
type storeEnv struct {
	name     string
	url      string // drip serve --store
	pgURL    string // the PostgreSQL server itself (install, locks)
	pg       *testserver.Postgres
	standby  *testserver.Postgres // a failover pair's
	bouncer  *testserver.PgBouncer
	redis    *testserver.Redis
	cluster  *testserver.RedisCluster
	sentinel *testserver.RedisSentinel // a master, a replica and three Sentinels
	dir      string
}

var storeNames = []string{"postgres", "pgbouncer", "redis", "cluster", "sentinel"}

// startStore starts the servers of a store and installs drip's schema
// where it needs one.
func startStore(ctx context.Context, name, dripBin string) (*storeEnv, error) {
	s := &storeEnv{name: name}
	var err error
	switch name {
	case "postgres", "pgbouncer":
		if s.pg, err = testserver.NewPostgres(); err != nil {
			return nil, err
		}
		s.pgURL, s.url = s.pg.URL(), s.pg.URL()
		if name == "pgbouncer" {
			if s.bouncer, err = testserver.NewPgBouncer(s.pg, 0); err != nil {
				s.stop()
				return nil, err
			}
			s.url = s.bouncer.URL()
		}
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(cctx, dripBin, "pg", "install", "--url", s.pgURL).CombinedOutput(); err != nil {
			s.stop()
			return nil, fmt.Errorf("drip pg install: %v: %s", err, out)
		}
	case "redis":
		if s.dir, err = os.MkdirTemp("", "drip-load-redis-"); err != nil {
			return nil, err
		}
		port, err := testserver.LoopbackPort()
		if err != nil {
			s.stop()
			return nil, err
		}
		if s.redis, err = testserver.LaunchRedis(s.dir, port); err != nil {
			s.stop()
			return nil, err
		}
		s.url = s.redis.URL()
	case "cluster":
		if s.dir, err = os.MkdirTemp("", "drip-load-cluster-"); err != nil {
			return nil, err
		}
		if s.cluster, err = testserver.LaunchRedisCluster(s.dir, 3, 1); err != nil {
			s.stop()
			return nil, err
		}
		s.url = s.cluster.URL()
	case "sentinel":
		if s.dir, err = os.MkdirTemp("", "drip-load-sentinel-"); err != nil {
			return nil, err
		}
		if s.sentinel, err = testserver.NewRedisSentinel(s.dir); err != nil {
			s.stop()
			return nil, err
		}
		s.url = s.sentinel.URL()
	default:
		return nil, fmt.Errorf("unknown store %q: want %s", name, strings.Join(storeNames, ", "))
	}
	return s, nil
}

func (s *storeEnv) stop() {
	if s.standby != nil {
		s.standby.Stop()
		s.standby.Remove()
	}
	if s.bouncer != nil {
		s.bouncer.Stop()
	}
	if s.pg != nil {
		s.pg.Stop()
		s.pg.Remove()
	}
	if s.redis != nil {
		s.redis.Stop()
	}
	if s.cluster != nil {
		s.cluster.Stop()
	}
	if s.sentinel != nil {
		s.sentinel.Stop()
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// redisNodes are the Redis servers of a Redis store: one, or the
// cluster's nodes.
func (s *storeEnv) redisNodes() []*testserver.Redis {
	if s.redis != nil {
		return []*testserver.Redis{s.redis}
	}
	if s.cluster != nil {
		return s.cluster.Nodes
	}
	return nil
}

// pause runs CLIENT PAUSE <d> ALL on every Redis server of the store.
func (s *storeEnv) pause(d time.Duration) error {
	nodes := s.redisNodes()
	if len(nodes) == 0 {
		return errors.New("not a Redis store")
	}
	errs := make(chan error, len(nodes))
	for _, n := range nodes {
		go func() {
			_, err := n.Cli("CLIENT", "PAUSE", strconv.FormatInt(d.Milliseconds(), 10), "ALL")
			errs <- err
		}()
	}
	var err error
	for range nodes {
		err = errors.Join(err, <-errs)
	}
	return err
}

// lock holds an ACCESS EXCLUSIVE lock on drip's tables for d, in a
// transaction on the PostgreSQL server itself (behind PgBouncer too). It
// calls locked once the lock is held, and returns once it is released.
func (s *storeEnv) lock(ctx context.Context, d time.Duration, locked func()) error {
	if s.pg == nil {
		return errors.New("not a PostgreSQL store")
	}
	conn, err := pgx.Connect(ctx, s.pgURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE drip.buckets, drip.leases IN ACCESS EXCLUSIVE MODE"); err != nil {
		tx.Rollback(ctx)
		return err
	}
	locked()
	time.Sleep(d)
	return tx.Commit(context.WithoutCancel(ctx))
}

// kill kills the store's server as a crash would, and starts it again
// after down. It calls killing just before, and returns once the server
// answers again.
func (s *storeEnv) kill(down time.Duration, killing func()) error {
	switch {
	case s.redis != nil:
		killing()
		s.redis.Kill()
		time.Sleep(down)
		return s.redis.Start()
	case s.pg != nil:
		killing()
		if err := s.pg.Kill(); err != nil {
			return err
		}
		time.Sleep(down)
		return s.pg.Start()
	}
	return errors.New("kill: only a PostgreSQL or Redis store (not a cluster)")
}

// startFailoverPair starts a PostgreSQL primary with drip's schema and a
// streaming standby of it; drip serve gets both in a multi-host URL that
// asks for the one that accepts writes.
func startFailoverPair(ctx context.Context, dripBin string) (*storeEnv, error) {
	s, err := startStore(ctx, "postgres", dripBin)
	if err != nil {
		return nil, err
	}
	if s.standby, err = testserver.NewPostgresStandby(s.pg); err != nil {
		s.stop()
		return nil, err
	}
	s.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		s.pg.Port(), s.standby.Port())
	return s, nil
}

// failover kills the primary as a crash would and promotes the standby.
// It calls killing just before, and returns once the standby accepts
// writes.
func (s *storeEnv) failover(killing func()) error {
	if s.sentinel != nil {
		return s.sentinelFailover(killing)
	}
	if s.standby == nil {
		return errors.New("failover: not a failover pair")
	}
	killing()
	if err := s.pg.Kill(); err != nil {
		return err
	}
	return s.standby.Promote()
}

// serve is a drip serve process.
type serve struct {
	c     *child
	addr  string // decision API or gateway
	admin string
	log   string
}

// startServe runs drip serve on the store with the rules file, as a
// gateway in front of upstream when it is not empty, and waits until its
// /readyz answers 200.
func startServe(ctx context.Context, dripBin, dir, storeURL, rulesFile, upstream string, extra []string) (*serve, error) {
	p1, err := testserver.LoopbackPort()
	if err != nil {
		return nil, err
	}
	p2, err := testserver.LoopbackPort()
	if err != nil {
		return nil, err
	}
	s := &serve{addr: "127.0.0.1:" + strconv.Itoa(p1), admin: "127.0.0.1:" + strconv.Itoa(p2)}
	args := []string{"serve", "--listen", s.addr, "--admin-listen", s.admin, "--store", storeURL, "--rules", rulesFile}
	if upstream != "" {
		args = append(args, "--upstream", upstream)
	}
	args = append(args, extra...)
	log, err := os.CreateTemp(dir, "drip-serve-*.log")
	if err != nil {
		return nil, err
	}
	defer log.Close()
	s.log = log.Name()
	cmd := exec.Command(dripBin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if s.c, err = startChild(cmd); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	client := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if s.c.exited() {
			break
		}
		if resp, err := client.Get("http://" + s.admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.stop()
	return nil, fmt.Errorf("drip serve not ready: %s", tailFile(s.log))
}

func (s *serve) stop() { s.c.stop(syscall.SIGTERM) }

func tailFile(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// buildDrip builds the drip command of the module this harness replaces
// github.com/driplimit/drip with (the repository's root) into dir.
func buildDrip(ctx context.Context, dir string) (string, error) {
	root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/driplimit/drip").Output()
	if err != nil {
		return "", fmt.Errorf("go list: %v (run from bench/)", err)
	}
	bin := filepath.Join(dir, "drip")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/drip")
	cmd.Dir = strings.TrimSpace(string(root))
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/drip: %v: %s", err, out)
	}
	return bin, nil
}

// readServeLog counts, in a drip serve log, the breaker's turns to open
// (it logs each change of state) and the warnings by message, numbers
// replaced by N (drip logs at most one store error a second).
func readServeLog(path string) (opens int, warns map[string]int64) {
	warns = map[string]int64{}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, warns
	}
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, `circuit breaker open" state=open`) {
			opens++
		}
		if _, rest, ok := strings.Cut(line, "level=WARN "); ok {
			warns[digits.ReplaceAllString(strings.TrimSpace(rest), "N")]++
		}
	}
	return opens, warns
}

// sentinelFailover kills the master of a Sentinel set as a crash would
// and returns once the Sentinels name the replica and it accepts writes
// (testserver's Sentinels judge a master down after
// testserver.SentinelDownAfter).
func (s *storeEnv) sentinelFailover(killing func()) error {
	old, next := s.sentinel.Master, s.sentinel.Replica
	killing()
	old.Kill()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if s.sentinel.MasterAddr() == s.sentinel.ClientAddr(next) {
			if out, err := next.Cli("SET", "drip-load-failover", "1"); err == nil && strings.Contains(out, "OK") {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("sentinel failover: the replica was not promoted within 30 s")
}
