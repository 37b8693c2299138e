package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/driplimit/drip/internal/spans"
	"github.com/driplimit/drip/store"
)

// retryable reports whether err is a serialization failure or a deadlock:
// the statement was rolled back and may be run again.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "40001" || pe.Code == "40P01"
	}
	return false
}

// answered reports a statement the server refused for the values it
// computed on: a data exception (SQLSTATE class 22: a value out of
// range, a division by zero) or an integrity constraint violation (class
// 23). Other errors (a connection, the server shutting down, a missing
// schema, a serialization failure retried to the end) say the store
// cannot serve.
func answered(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23"))
}

// retry runs f until it succeeds, fails with an error that is not
// retryable, or has been tried cfg.attempts times.
func (s *Store) retry(ctx context.Context, f func() error) (err error) {
	defer func() {
		switch {
		case answered(err):
			// The server ran the statement and refused it, for the
			// values of this call's items: it is up.
			err = &store.AnsweredError{Err: err}
		case err != nil && !errors.Is(err, errRace):
			// A failed connection or server: the next answer may come
			// from another server (a failover), whose clock is learned
			// afresh.
			s.clock.ForgetOn(err)
		}
	}()
	wait := s.cfg.backoff
	fell := false // switched to FallbackQueryMode once
	for attempt := 1; ; attempt++ {
		err = f()
		if err == nil {
			return nil
		}
		if errors.Is(err, errRace) {
			if attempt >= 2*s.cfg.attempts {
				return err
			}
			s.retries.Add(1)
			spans.Retry(ctx, attempt, "race")
			continue
		}
		if !fell && s.fallBack(err) {
			fell = true
			spans.Retry(ctx, attempt, "query_mode_fallback")
			continue
		}
		if !retryable(err) {
			return err
		}
		if attempt >= s.cfg.attempts {
			return fmt.Errorf("pgstore: gave up after %d attempts: %w", attempt, err)
		}
		s.retries.Add(1)
		spans.Retry(ctx, attempt, "conflict") // a serialization failure or a deadlock
		d := wait/2 + rand.N(wait/2+1)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pgstore: %w (while retrying: %v)", ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, s.cfg.maxBackoff)
	}
}

// IsSerializationFailure reports whether err is (or wraps) a serialization
// failure or deadlock that survived the store's retries.
func IsSerializationFailure(err error) bool { return retryable(err) }
