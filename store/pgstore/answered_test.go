package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/storetest"
)

// TestAnsweredErrorFailsAlone: a row whose values overflow the
// statement's int8 arithmetic (SQLSTATE 22003: something other than drip
// wrote it) fails its own requests with a store.AnsweredError, and only
// them: the requests batched with one in a statement are decided.
func TestAnsweredErrorFailsAlone(t *testing.T) {
	t.Parallel()
	p := pool(t)
	// One statement at a time: concurrent requests wait and are batched.
	st := newStore(t, pgstore.WithBatching(pgstore.Batching{MaxBatch: 64, InFlight: 1}))
	ctx := context.Background()
	pre := prefix()
	lim := drip.Limit{Rate: 1, Period: time.Hour, Burst: 1000}
	take := func(key string) (drip.Decision, error) {
		return storetest.Apply(ctx, st, bucket.Take, time.Time{}, drip.Request{Key: pre + key, Limit: lim, Cost: 1})
	}
	if _, err := take("bad"); err != nil {
		t.Fatal(err)
	}
	tag, err := p.Exec(ctx, `UPDATE drip.buckets SET tokens = -9000000000000000000, ts = -9223372036854775000 WHERE key = drip.key($1)`, pre+"bad")
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("spoiling the row: %v, %v", tag, err)
	}
	var mu sync.Mutex
	var badOK, goodFailed []string
	for round := range 10 {
		var wg sync.WaitGroup
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("good%d", i)
				if i%8 == 0 {
					key = "bad"
				}
				d, err := take(key)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case key == "bad" && !store.IsAnswered(err):
					badOK = append(badOK, fmt.Sprintf("round %d: %+v, %v", round, d, err))
				case key != "bad" && (err != nil || !d.Allowed):
					goodFailed = append(goodFailed, fmt.Sprintf("round %d %s: %+v, %v", round, key, d, err))
				}
			}()
		}
		wg.Wait()
	}
	if len(badOK) > 0 {
		t.Errorf("%d takes on the spoiled row without an AnsweredError, e.g. %s", len(badOK), badOK[0])
	}
	if len(goodFailed) > 0 {
		t.Errorf("%d takes on other keys not decided, e.g. %s", len(goodFailed), goodFailed[0])
	}
}
