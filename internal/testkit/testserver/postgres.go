package testserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PostgresURLEnv names the environment variable that points the tests at
// an existing PostgreSQL server instead of one they start themselves.
const PostgresURLEnv = "DRIP_TEST_POSTGRES_URL"

// Postgres is a throwaway PostgreSQL server: initdb in a temporary
// directory (or a copy of an earlier initdb's: see initdb), a postgres
// process listening on a free loopback port (and a Unix socket in the same
// directory), fsync off. When the tests run as root (PostgreSQL refuses
// to), the server runs as the postgres system user.
//
// A Postgres made from DRIP_TEST_POSTGRES_URL is external: URL works,
// Stop, Start, Restart and Kill fail the test.
type Postgres struct {
	bin      string
	dir      string
	port     int
	external string
	cred     *syscall.Credential
	args     []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited <-chan struct{}
	log    *os.File
}

// PostgresBinDir finds the PostgreSQL server binaries: PG_BINDIR, then
// pg_config --bindir, then Debian's /usr/lib/postgresql/<version>/bin
// (newest first). It returns "" when none is found.
func PostgresBinDir() string {
	ok := func(dir string) bool {
		_, e1 := os.Stat(filepath.Join(dir, "initdb"))
		_, e2 := os.Stat(filepath.Join(dir, "postgres"))
		return e1 == nil && e2 == nil
	}
	if d := os.Getenv("PG_BINDIR"); d != "" && ok(d) {
		return d
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); ok(d) {
			return d
		}
	}
	vs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	best, bestV := "", -1
	for _, d := range vs {
		v, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err == nil && v > bestV && ok(d) {
			best, bestV = d, v
		}
	}
	return best
}

var shared struct {
	once sync.Once
	pg   *Postgres
	err  error
}

// SharedPostgres returns one server shared by every test of the binary:
// DRIP_TEST_POSTGRES_URL when set, else a server started on first use.
// Tests that share it must keep their keys apart. Call StopSharedPostgres
// from TestMain so the server does not outlive the test binary. Tests that
// stop or restart the server must use StartPostgres instead.
func SharedPostgres(t testing.TB) *Postgres {
	t.Helper()
	if u := os.Getenv(PostgresURLEnv); u != "" {
		return &Postgres{external: u}
	}
	shared.once.Do(func() {
		shared.pg, shared.err = NewPostgres()
	})
	if shared.err != nil {
		if errors.Is(shared.err, errMissing) {
			Missing(t, "%v", shared.err)
		}
		t.Fatalf("start postgres: %v", shared.err)
	}
	return shared.pg
}

// StopSharedPostgres stops the server SharedPostgres started, if any; a
// later SharedPostgres starts a new one (as go test -count=N needs).
func StopSharedPostgres() {
	if shared.pg != nil {
		shared.pg.Stop()
		shared.pg.Remove()
	}
	shared.pg, shared.err = nil, nil
	shared.once = sync.Once{}
}

// StartPostgres starts a server of the test's own, stopped and removed
// when the test ends. It ignores DRIP_TEST_POSTGRES_URL: it is for tests
// that stop, kill or restart the server.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	p, err := NewPostgres()
	if err != nil {
		if errors.Is(err, errMissing) {
			Missing(t, "%v", err)
		}
		t.Fatalf("start postgres: %v", err)
	}
	t.Cleanup(func() { p.Stop(); p.Remove() })
	return p
}

var errMissing = errors.New("PostgreSQL server binaries (initdb, postgres) not found: install postgresql or set PG_BINDIR")

// NewPostgres initializes and starts a server. The caller must Stop and
// Remove it. It is the building block of StartPostgres and SharedPostgres,
// for TestMain and benchmarks. settings are extra server settings
// ("fsync=on", "max_connections=300"), applied after the defaults (fsync
// off: a crash of the machine may lose data, a crash of the server does
// not).
func NewPostgres(settings ...string) (*Postgres, error) {
	bin := PostgresBinDir()
	if bin == "" {
		return nil, errMissing
	}
	// os.MkdirTemp under os.TempDir (not t.TempDir, whose parents may be
	// 0700): the server user must be able to reach the directory.
	dir, err := os.MkdirTemp("", "drip-pg-")
	if err != nil {
		return nil, err
	}
	p := &Postgres{bin: bin, dir: dir, args: settings}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			p.Remove()
			return nil, fmt.Errorf("running as root and no postgres user to run the server as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chmod(dir, 0o755); err != nil {
			p.Remove()
			return nil, err
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			p.Remove()
			return nil, err
		}
	}
	if err := p.initdb(); err != nil {
		p.Remove()
		return nil, err
	}
	p.port, err = freePort()
	if err != nil {
		p.Remove()
		return nil, err
	}
	if err := p.start(); err != nil {
		p.Remove()
		return nil, err
	}
	return p, nil
}

// initdbArgs are the arguments of initdb after its data directory.
var initdbArgs = []string{"-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"}

// initdb lays out the server's data directory. initdb takes seconds of a
// loaded machine (it starts a server of its own to build the catalogs),
// and a test run starts dozens of servers, each with the same initdb. So
// the first initdb's result is kept as a template under os.TempDir, named
// after the initdb binary (its path, size and time) and arguments, and
// later servers, in this test binary or another, copy it (cp -a keeps the
// owner and modes PostgreSQL checks). The template appears whole or not at
// all (a rename), so a binary that dies while making it leaves none.
func (p *Postgres) initdb() error {
	bin := filepath.Join(p.bin, "initdb")
	fi, err := os.Stat(bin)
	if err != nil {
		return err
	}
	h := sha256.Sum256(fmt.Appendf(nil, "%s %d %d %d %q", bin, fi.Size(), fi.ModTime().UnixNano(), os.Geteuid(), initdbArgs))
	template := filepath.Join(os.TempDir(), "drip-pg-template-"+hex.EncodeToString(h[:8]))
	if _, err := os.Stat(filepath.Join(template, "PG_VERSION")); err == nil {
		out, err := exec.Command("cp", "-a", template, p.dataDir()).CombinedOutput()
		if err == nil {
			return nil
		}
		os.RemoveAll(p.dataDir())
		fmt.Fprintf(os.Stderr, "testserver: copying %s failed, running initdb instead: %v %s\n", template, err, out)
	}
	var out bytes.Buffer
	initdb := exec.Command(bin, append([]string{"-D", p.dataDir()}, initdbArgs...)...)
	initdb.Stdout, initdb.Stderr = &out, &out
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	if err := initdb.Run(); err != nil {
		return fmt.Errorf("initdb: %v\n%s", err, out.String())
	}
	// Keep it as the template, unless another server was quicker.
	tmp, err := os.MkdirTemp(filepath.Dir(template), "drip-pg-template-new-")
	if err != nil {
		return nil
	}
	defer os.RemoveAll(tmp)
	if exec.Command("cp", "-a", p.dataDir(), filepath.Join(tmp, "data")).Run() == nil {
		os.Rename(filepath.Join(tmp, "data"), template)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (p *Postgres) dataDir() string { return filepath.Join(p.dir, "data") }

// URL is the server's connection URL (database postgres, user postgres).
func (p *Postgres) URL() string {
	if p.external != "" {
		return p.external
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

// External reports whether the server came from DRIP_TEST_POSTGRES_URL.
func (p *Postgres) External() bool { return p.external != "" }

// Port is the server's TCP port (0 for an external server).
func (p *Postgres) Port() int { return p.port }

func (p *Postgres) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return errors.New("postgres already running")
	}
	log, err := os.OpenFile(filepath.Join(p.dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), "-D", p.dataDir(),
		"-p", strconv.Itoa(p.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+p.dir,
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=200",
		"-c", "shared_buffers=128MB",
		"-c", "autovacuum_naptime=10s",
	)
	for _, a := range p.args {
		cmd.Args = append(cmd.Args, "-c", a)
	}
	cmd.Stdout, cmd.Stderr = log, log
	// Pdeathsig: if the test binary dies without stopping the server, the
	// server shuts down at once instead of lingering.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	exited, err := start(cmd)
	if err != nil {
		log.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	p.cmd, p.log, p.exited = cmd, log, exited
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			p.cmd = nil
			log.Close()
			return fmt.Errorf("postgres exited at start:\n%s", p.tail())
		default:
		}
		if p.ready() {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("postgres not ready after 30s:\n%s", p.tail())
}

// ready reports whether the server accepts connections, asked through
// pg_isready so that this package needs no driver.
func (p *Postgres) ready() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, filepath.Join(p.bin, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(p.port), "-U", "postgres", "-d", "postgres")
	return c.Run() == nil
}

func (p *Postgres) tail() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "postgres.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (p *Postgres) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.external != "" {
		return errors.New("external server (DRIP_TEST_POSTGRES_URL) cannot be stopped")
	}
	if p.cmd == nil {
		return nil
	}
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	// Children of a killed postmaster exit on their own; wait until the
	// port is free for a restart.
	for range 200 {
		if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)), 50*time.Millisecond); err == nil {
			c.Close()
			time.Sleep(25 * time.Millisecond)
			continue
		}
		break
	}
	p.log.Close()
	return nil
}

// Stop shuts the server down (fast shutdown: open sessions are ended).
func (p *Postgres) Stop() error { return p.signal(syscall.SIGINT) }

// Kill stops the server as a crash would (immediate shutdown: recovery
// runs at the next start, and UNLOGGED tables come back empty).
func (p *Postgres) Kill() error { return p.signal(syscall.SIGQUIT) }

// Start starts a stopped server again, on the same port and data.
func (p *Postgres) Start() error {
	if p.external != "" {
		return errors.New("external server (DRIP_TEST_POSTGRES_URL) cannot be started")
	}
	return retryBind(p.start)
}

// Restart stops and starts the server.
func (p *Postgres) Restart() error {
	if err := p.Stop(); err != nil {
		return err
	}
	return p.Start()
}

// Remove deletes the server's directory; the server must be stopped.
func (p *Postgres) Remove() {
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
}
