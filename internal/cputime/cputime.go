// Package cputime measures the process's CPU time, for benchmarks on a
// shared machine: other work there disturbs the wall time of a benchmark
// much more than the CPU time its own process spends.
package cputime

import (
	"syscall"
	"testing"
	"time"
)

// Process is the process's CPU time so far, user and system.
func Process() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		panic(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// Report reports the CPU time the process spent since start (a Process
// reading taken after b.ResetTimer) per iteration of b, as cpu-ns/op.
// Run such benchmarks with -cpu 1: the figure counts every thread.
func Report(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(Process()-start)/float64(b.N), "cpu-ns/op")
}
