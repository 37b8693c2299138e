package server

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/redisstore"
)

// TestAnsweredErrorsKeepTheBreakerClosed: a request the store answers
// with an error about its own key (Redis: the key holds another type;
// PostgreSQL: a row whose values overflow the statement's arithmetic,
// SQLSTATE 22003) fails alone, with 500 and no Retry-After, however often
// it comes: the circuit breaker, which is for a store that does not
// answer, stays closed, and another key is decided.
func TestAnsweredErrorsKeepTheBreakerClosed(t *testing.T) {
	for _, kind := range []string{"redis", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			var st store.Store
			var spoil func(key string) // corrupts key's stored value
			ctx := context.Background()
			switch kind {
			case "redis":
				s, err := redisstore.Open(testserver.SharedRedisURL(t), redisstore.WithPrefix(testserver.Prefix()))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				st = s
				spoil = func(key string) {
					c := s.Client()
					if err := c.Do(ctx, c.B().Del().Key(s.Prefix()+key).Build()).Error(); err != nil {
						t.Fatal(err)
					}
					if err := c.Do(ctx, c.B().Hset().Key(s.Prefix()+key).FieldValue().FieldValue("f", "v").Build()).Error(); err != nil {
						t.Fatal(err)
					}
				}
			case "postgres":
				pg := testserver.SharedPostgres(t)
				s := openPostgres(t, pg.URL())
				prefix := testserver.Prefix()
				st = store.Prefixed{Store: s, Prefix: prefix}
				spoil = func(key string) {
					conn, err := pgx.Connect(ctx, pg.URL())
					if err != nil {
						t.Fatal(err)
					}
					defer conn.Close(ctx)
					// A debt and a time no decision makes: refilling it
					// overflows the statement's int8 arithmetic.
					tag, err := conn.Exec(ctx, `UPDATE drip.buckets SET tokens = -9000000000000000000, ts = -9223372036854775000 WHERE key = drip.key($1)`, prefix+key)
					if err != nil || tag.RowsAffected() != 1 {
						t.Fatalf("spoiling %s: %v, %v", key, tag, err)
					}
				}
			}
			srv := start(t, Config{}, st)
			body := func(key string) string { return `{"key": "` + key + `", ` + lim + `}` }
			if code, out := post(t, srv.base+"/v1/take", body("bad")); code != http.StatusOK {
				t.Fatalf("first take: %d %s", code, out)
			}
			spoil(InlinePrefix + "bad")
			var answers []string // of the takes on the spoiled key
			for range 30 {
				req, _ := http.NewRequest(http.MethodPost, srv.base+"/v1/take", strings.NewReader(body("bad")))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				answers = append(answers, resp.Status+" Retry-After="+resp.Header.Get("Retry-After"))
			}
			code, out := post(t, srv.base+"/v1/take", body("good"))
			if code != http.StatusOK || !decision(t, out).Allowed {
				t.Errorf("another key after the errors: %d %s, want it decided (allowed)", code, out)
			}
			for i, a := range answers {
				if a != "500 Internal Server Error Retry-After=" {
					t.Fatalf("take %d on the spoiled key: %s, want 500 without Retry-After", i, a)
				}
			}
			if s := srv.eng.BreakerState(); s != "closed" {
				t.Errorf("breaker %s, want closed", s)
			}
			_, metrics := call(t, "GET", srv.admin+"/metrics", "")
			if want := `drip_store_errors_total{op="take"} 30`; !strings.Contains(metrics, want) {
				t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "drip_store_errors_total"))
			}
		})
	}
}
