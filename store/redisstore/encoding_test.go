package redisstore_test

import (
	"context"
	"encoding/binary"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/storetest"
)

// TestEncoding checks both forms of a stored bucket: a take writes the
// binary form (a zero byte and four little-endian doubles) while tokens
// fit in 2^53, and the decimal form beyond; the script reads both,
// including decimals a bucket was written as before the binary form.
func TestEncoding(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t))
	c := s.Client()
	ctx := context.Background()
	at := time.Unix(1_700_000_000, 250)
	get := func(key string) string {
		t.Helper()
		v, err := c.Do(ctx, c.B().Get().Key("drip:"+key).Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// Binary: 10 tokens - 3 at a fixed time.
	key := "enc:" + randomTag()
	lim := drip.Limit{Rate: 1, Period: time.Hour, Burst: 10}
	if d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 3}); err != nil || !d.Allowed {
		t.Fatalf("take: %+v, %v", d, err)
	}
	v := get(key)
	if len(v) != 33 || v[0] != 0 {
		t.Fatalf("stored %q: want a zero byte and 32 bytes of doubles", v)
	}
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[1+8*i:]))) }
	if f(0) != 7e6 || f(1) != 1_700_000_000 || f(2) != 250 {
		t.Fatalf("stored tokens, s, n = %v, %v, %v; want 7e6, 1.7e9, 250", f(0), f(1), f(2))
	}

	// Decimal, as a bucket written before the binary form: read as such
	// (4.5 tokens at the same instant), and rewritten in binary.
	if err := c.Do(ctx, c.B().Set().Key("drip:"+key).Value("4500000 1700000000 250 0").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 1})
	if err != nil || !d.Allowed || d.Remaining != 3 {
		t.Fatalf("take on a decimal bucket of 4.5 tokens: %+v, %v; want allowed, 3 remaining (3.5)", d, err)
	}
	if v := get(key); len(v) != 33 || v[0] != 0 {
		t.Fatalf("rewritten as %q, want binary", v)
	}

	// Beyond 2^53 micro-tokens: decimal, exact.
	key = "enc:" + randomTag()
	big := drip.Limit{Rate: 1, Period: time.Hour, Burst: 1e12}
	if d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: big, Cost: 1}); err != nil || !d.Allowed {
		t.Fatalf("take: %+v, %v", d, err)
	}
	want := strconv.FormatInt(1e12*1e6-1e6, 10) + " 1700000000 250 "
	if v := get(key); len(v) < len(want) || v[:len(want)] != want {
		t.Fatalf("stored %q, want %q and a deadline", v, want)
	}
}
