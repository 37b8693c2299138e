package pgstore

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Each retry of a statement, and the switch of query mode behind a
// pooler, is an event on the store-call span in the statement's context.
func TestRetrySpanEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { // the backoff waits on virtual time
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
		defer tp.Shutdown(context.Background())
		s := &Store{cfg: config{attempts: 10, backoff: time.Millisecond, maxBackoff: 100 * time.Millisecond},
			dbm: newModeDB(nil, pgx.QueryExecModeCacheStatement)}
		errs := []error{
			&pgconn.PgError{Code: "26000"}, // a transaction-mode pooler lost the prepared statement
			&pgconn.PgError{Code: "40001"},
			&pgconn.PgError{Code: "40P01"},
			errRace,
			nil,
		}
		ctx, sp := tp.Tracer("test").Start(context.Background(), "drip.store")
		if err := s.retry(ctx, func() error { e := errs[0]; errs = errs[1:]; return e }); err != nil {
			t.Fatal(err)
		}
		sp.End()
		var reasons []string
		for _, ev := range rec.Ended()[0].Events() {
			for _, kv := range ev.Attributes {
				if ev.Name == "drip.retry" && kv.Key == "drip.reason" {
					reasons = append(reasons, kv.Value.AsString())
				}
			}
		}
		want := []string{"query_mode_fallback", "conflict", "conflict", "race"}
		if len(reasons) != len(want) {
			t.Fatalf("retry events %q, want %q", reasons, want)
		}
		for i := range want {
			if reasons[i] != want[i] {
				t.Fatalf("retry events %q, want %q", reasons, want)
			}
		}
	})
}
