package testserver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// NewPostgresStandby makes a streaming replica of primary (a base backup
// with the primary's address in its settings) and starts it on a port of
// its own, for failover runs: stop or kill the primary, then Promote the
// standby. The caller must Stop and Remove it.
func NewPostgresStandby(primary *Postgres) (*Postgres, error) {
	if primary.external != "" {
		return nil, errors.New("an external server (DRIP_TEST_POSTGRES_URL) has no standby")
	}
	dir, err := os.MkdirTemp("", "drip-pg-standby-")
	if err != nil {
		return nil, err
	}
	p := &Postgres{bin: primary.bin, dir: dir, cred: primary.cred, args: primary.args}
	if p.cred != nil {
		if err := os.Chmod(dir, 0o755); err != nil {
			p.Remove()
			return nil, err
		}
		if err := os.Chown(dir, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			p.Remove()
			return nil, err
		}
	}
	var out bytes.Buffer
	backup := exec.Command(filepath.Join(p.bin, "pg_basebackup"), "-h", "127.0.0.1",
		"-p", strconv.Itoa(primary.port), "-U", "postgres", "-D", p.dataDir(),
		"-R", "-X", "stream", "--no-sync", "-c", "fast")
	backup.Stdout, backup.Stderr = &out, &out
	backup.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	if err := backup.Run(); err != nil {
		p.Remove()
		return nil, fmt.Errorf("pg_basebackup: %v\n%s", err, out.String())
	}
	if p.port, err = freePort(); err != nil {
		p.Remove()
		return nil, err
	}
	if err := p.start(); err != nil {
		p.Remove()
		return nil, err
	}
	return p, nil
}

// Promote ends a standby's recovery and makes it a primary that accepts
// writes, waiting until it does.
func (p *Postgres) Promote() error {
	if p.external != "" {
		return errors.New("external server (DRIP_TEST_POSTGRES_URL) cannot be promoted")
	}
	var out bytes.Buffer
	cmd := exec.Command(filepath.Join(p.bin, "pg_ctl"), "promote", "-w", "-t", "60", "-D", p.dataDir())
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pg_ctl promote: %v\n%s", err, out.String())
	}
	return nil
}
