package pgstore

import (
	"context"
	"time"
)

func (s *Store) sweeper() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-s.stop:
				case <-ctx.Done():
				}
				cancel()
			}()
			_, _ = s.Sweep(ctx)
			cancel()
		}
	}
}

// SweepMargin is how long after a bucket expires (is full again, by the
// server's clock) the sweeper deletes it, as memstore.SweepMargin.
const SweepMargin = time.Minute

// Sweep walks the whole table once, deleting the buckets (those with
// blocks of leased tokens once every block expired, and the lease rows of
// concurrency limits) that expired
// SweepMargin ago by the server's clock, one page of rows per statement (see
// WithSweepPage), never waiting on a row lock. It returns how many it
// deleted. The store's sweeper calls it on a timer; it is exported for
// tests and for operators who run it from a job instead.
func (s *Store) Sweep(ctx context.Context) (int64, error) {
	var total int64
	after := []byte{}
	fell := false // switched to FallbackQueryMode once
	for {
		var last []byte
		var n int64
		err := s.db.QueryRow(ctx, sweepSQL, after, s.cfg.sweepPage, int64(SweepMargin)).Scan(&last, &n)
		if err != nil && !fell && s.fallBack(err) {
			fell = true
			continue // nothing ran: the same page again
		}
		if err != nil {
			return total, err
		}
		total += n
		if last == nil {
			break
		}
		after = last
	}
	// The lease rows of concurrency limits, a page at a time.
	for {
		var n int64
		if err := s.db.QueryRow(ctx, sweepLeasesSQL, s.cfg.sweepPage, int64(SweepMargin)).Scan(&n); err != nil {
			return total, err
		}
		total += n
		if n < int64(s.cfg.sweepPage) {
			break
		}
	}
	return total, nil
}
