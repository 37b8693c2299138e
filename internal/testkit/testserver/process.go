package testserver

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a server process of a test's own (nginx, Caddy), started by
// StartProcess and killed when the test ends.
type Process struct {
	cmd  *exec.Cmd
	done <-chan struct{}
	out  *LockedBuffer
}

// Binary finds a test dependency's binary: on PATH, else at one of the
// given paths (/usr/sbin is not on every user's PATH). A missing one
// skips the test, or fails it under CI=true (Missing); install is what to
// tell the reader to install.
func Binary(t testing.TB, name, install string, paths ...string) string {
	t.Helper()
	if bin, err := exec.LookPath(name); err == nil {
		return bin
	}
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	Missing(t, "%s not found: install the %s package", name, install)
	return ""
}

// StartProcess starts cmd with its output kept (Output) and Pdeathsig set,
// so that a test binary that dies takes it along (a server that forks,
// such as nginx with its master process, would leave its children:
// run it as one process), and stops it when the test ends. It does not wait for the server to be ready: poll it
// (Exited tells whether it gave up, for example on a port taken).
func StartProcess(t testing.TB, cmd *exec.Cmd) *Process {
	t.Helper()
	p := &Process{cmd: cmd, out: new(LockedBuffer)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	done, err := start(cmd)
	if err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	p.done = done
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("%s output:\n%s", cmd.Path, p.Output())
		}
	})
	return p
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop asks the process to stop (SIGTERM), kills it if it has not within
// 10 s, and waits for it. It is safe to call more than once.
func (p *Process) Stop() {
	if p.Exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(10 * time.Second):
	}
	p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		fmt.Fprintf(os.Stderr, "testserver: %s did not exit 30 s after SIGKILL\n", p.cmd.Path)
	}
}

// Output is what the process wrote so far, standard output and error.
func (p *Process) Output() string { return p.out.String() }

// LockedBuffer is an io.Writer that a process's output streams may write
// while the test reads it.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// retryBind runs start until it does not fail on a port in use, for up to
// 20 s. A stopped server's port lies in the kernel's ephemeral range, and
// while the server is down a client retrying its connection may hold that
// port for a moment (a TCP self-connect, or a source port it was given):
// the restart then waits for it instead of failing the test.
func retryBind(start func() error) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := start()
		if err == nil || !strings.Contains(err.Error(), "Address already in use") || time.Now().After(deadline) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}
