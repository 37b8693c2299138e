package testserver

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PgBouncer is a pgbouncer process in transaction pooling mode in front of
// a Postgres: every transaction (every statement outside one) may run on
// a different server connection, as behind PgBouncer, RDS Proxy or a
// hosted provider's pooler. Like PostgreSQL, it runs as the postgres user
// when the tests run as root.
type PgBouncer struct {
	dir  string
	port int
	url  url.URL // the server's
	cred *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	done <-chan struct{}
}

// PgBouncerPoolSize is how many server connections the pooler opens to
// PostgreSQL (default_pool_size): fewer than the clients' connections, so
// that transactions of one client connection land on several server
// connections and those of several clients on one.
const PgBouncerPoolSize = 4

var errNoPgBouncer = errors.New("pgbouncer not found: install the pgbouncer package")

// NewPgBouncer starts pgbouncer in transaction mode in front of pg, on a
// free loopback port, trusting every user (as the throwaway server does),
// with at most poolSize server connections (0: PgBouncerPoolSize). The
// caller must Stop it.
func NewPgBouncer(pg *Postgres, poolSize int) (*PgBouncer, error) {
	if poolSize <= 0 {
		poolSize = PgBouncerPoolSize
	}
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, e := os.Stat("/usr/sbin/pgbouncer"); e != nil {
			return nil, errNoPgBouncer
		}
		bin = "/usr/sbin/pgbouncer"
	}
	u, err := url.Parse(pg.URL())
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "drip-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{dir: dir, url: *u}
	if os.Geteuid() == 0 {
		pu, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root and no postgres user to run pgbouncer as: %w", err)
		}
		uid, _ := strconv.Atoi(pu.Uid)
		gid, _ := strconv.Atoi(pu.Gid)
		b.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if b.port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	name := u.User.Username()
	if name == "" {
		name = "postgres"
	}
	conf := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 1000
max_db_connections = %d
ignore_startup_parameters = extra_float_digits
logfile = %s
`, u.Hostname(), u.Port(), b.port, filepath.Join(dir, "users.txt"), poolSize,
		poolSize, filepath.Join(dir, "pgbouncer.log"))
	files := map[string]string{"pgbouncer.ini": conf, "users.txt": strconv.Quote(name) + ` ""` + "\n"}
	for f, text := range files {
		path := filepath.Join(dir, f)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if b.cred != nil {
			os.Chown(path, int(b.cred.Uid), int(b.cred.Gid))
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	// No Pdeathsig here, unlike the servers: with it, pgbouncer 1.18 was
	// killed between two subtests in about one run of three (it lives
	// until Stop, which every caller defers or registers as a cleanup).
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred}
	done, err := start(cmd)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	b.cmd, b.done = cmd, done
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-b.done:
			b.cmd = nil
			log := tail(filepath.Join(dir, "pgbouncer.log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgbouncer exited at start: %s", log)
		default:
		}
		if c, err := net.DialTimeout("tcp", b.addr(), 100*time.Millisecond); err == nil {
			c.Close()
			return b, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Stop()
	return nil, fmt.Errorf("pgbouncer not listening after 20s: %s", tail(filepath.Join(dir, "pgbouncer.log")))
}

// StartPgBouncer starts a pooler of the test's own in front of pg (see
// NewPgBouncer), stopped when the test ends. A missing pgbouncer skips the
// test, or fails it under CI=true.
func StartPgBouncer(t testing.TB, pg *Postgres, poolSize int) *PgBouncer {
	t.Helper()
	b, err := NewPgBouncer(pg, poolSize)
	if errors.Is(err, errNoPgBouncer) {
		Missing(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

func (b *PgBouncer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// URL is the pooler's connection URL: the server's, at the pooler's
// address.
func (b *PgBouncer) URL() string {
	u := b.url
	u.Host = b.addr()
	return u.String()
}

// Log is the end of the pooler's log.
func (b *PgBouncer) Log() string { return tail(filepath.Join(b.dir, "pgbouncer.log")) }

// Stop stops the pooler and removes its files. It is safe to call more
// than once.
func (b *PgBouncer) Stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd != nil {
		b.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-b.done:
		case <-time.After(10 * time.Second):
			b.cmd.Process.Kill()
			<-b.done
		}
		b.cmd = nil
	}
	os.RemoveAll(b.dir)
}
