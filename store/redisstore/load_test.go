package redisstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

// takeLoad is workers goroutines taking one token at a time from keys,
// round robin, each with a deadline of a second, until Stop: the load of
// the failover tests. It counts decisions (and those after Mark), errors,
// the time of the last error, and grants per key.
type takeLoad struct {
	start            time.Time
	oks, errs, after atomic.Int64
	marked           atomic.Bool
	lastErr          atomic.Int64 // since start
	grants           []atomic.Int64
	stop             chan struct{}
	wg               sync.WaitGroup
}

func startTakeLoad(s *redisstore.Store, keys []string, lim drip.Limit, workers int) *takeLoad {
	l := &takeLoad{start: time.Now(), grants: make([]atomic.Int64, len(keys)), stop: make(chan struct{})}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := w; ; i += workers {
				select {
				case <-l.stop:
					return
				default:
				}
				k := i % len(keys)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				d, err := storetest.Apply(ctx, s, bucket.Take, time.Time{}, drip.Request{Key: keys[k], Limit: lim, Cost: 1})
				cancel()
				if err != nil {
					l.errs.Add(1)
					l.lastErr.Store(int64(time.Since(l.start)))
					time.Sleep(2 * time.Millisecond)
					continue
				}
				l.oks.Add(1)
				if l.marked.Load() {
					l.after.Add(1)
				}
				if d.Allowed {
					l.grants[k].Add(1)
				}
			}
		}()
	}
	return l
}

// Mark starts counting decisions as after; it returns the time since
// the load started.
func (l *takeLoad) Mark() time.Duration {
	l.marked.Store(true)
	return time.Since(l.start)
}

// WaitOKs waits until n decisions were made, for at most 30 s.
func (l *takeLoad) WaitOKs(t *testing.T, n int64) {
	t.Helper()
	for warm := time.Now().Add(30 * time.Second); l.oks.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(warm) {
			l.Stop()
			t.Fatalf("only %d decisions (%d errors) in 30 s", l.oks.Load(), l.errs.Load())
		}
	}
}

// RunAfter lets the load go on until n more decisions after Mark were
// made (for at most 60 s), stops it, and reports whether they were.
func (l *takeLoad) RunAfter(n int64) bool {
	target := l.after.Load() + n
	for deadline := time.Now().Add(60 * time.Second); l.after.Load() < target && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	l.Stop()
	return l.after.Load() >= target
}

// Stop stops the load and waits for its workers. It is safe to call more
// than once.
func (l *takeLoad) Stop() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}
