package testserver

import (
	"os/exec"
	"runtime"
	"syscall"
)

// start starts cmd and returns a channel closed when it has exited.
//
// The servers are started with Pdeathsig, so that a test binary that dies
// without stopping them takes them along. Linux sends that signal when the
// thread that started the child exits, not the process, and the Go
// runtime ends a thread whose goroutine exits while locked to it, which
// killed a pooler mid-test. So the child is started from a goroutine
// locked to its thread, which lives until the child has exited.
func start(cmd *exec.Cmd) (<-chan struct{}, error) {
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		close(done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}

// Start starts cmd the way this package starts its servers, for programs
// that have no testing.TB (bench/loadtest): with Pdeathsig SIGKILL unless
// cmd sets its own, from a goroutine locked to its thread. The channel is
// closed when the process has exited.
func Start(cmd *exec.Cmd) (<-chan struct{}, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if cmd.SysProcAttr.Pdeathsig == 0 {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	return start(cmd)
}

// LoopbackPort returns a loopback TCP port that was free a moment ago,
// for programs that have no testing.TB (FreePort).
func LoopbackPort() (int, error) { return freePort() }
