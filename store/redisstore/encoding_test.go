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

// TestEncoding checks the forms of a stored bucket: a take writes the
// short form (n plus 2^31, s and the tokens as big-endian 32-bit
// integers, 12 bytes, the TTL's end left to the key) while tokens fit in
// 32 bits and s in [0, 2^32), the compact form of earlier versions (the
// byte 1, tokens as a 7-byte signed integer, s, n and the TTL deadline in
// whole seconds as 32-bit unsigned ones, all little-endian) for tokens
// beyond 32 bits, the binary form (a zero byte and four little-endian
// doubles) for an s beyond, and the decimal form for tokens beyond 2^52;
// the script reads them all, including the compact, binary and decimal
// buckets earlier versions wrote.
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
	set := func(key, v string) {
		t.Helper()
		if err := c.Do(ctx, c.B().Set().Key("drip:"+key).Value(v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	short := func(v string) (tokens int32, sec, nsec uint32) {
		t.Helper()
		if len(v) != 12 || v[0] < 128 {
			t.Fatalf("stored %q: want the short form, 12 bytes from a byte of 128 or more", v)
		}
		b := []byte(v)
		return int32(binary.BigEndian.Uint32(b[8:])), binary.BigEndian.Uint32(b[4:]), binary.BigEndian.Uint32(b) - 1<<31
	}
	compact := func(v string) (tokens int64, sec, nsec, deadline uint32) {
		t.Helper()
		if len(v) != 20 || v[0] != 1 {
			t.Fatalf("stored %q: want the compact form, 20 bytes from the byte 1", v)
		}
		b := []byte(v)
		tokens = int64(binary.LittleEndian.Uint64(append(b[1:8:8], 0))<<8) >> 8
		return tokens, binary.LittleEndian.Uint32(b[8:]), binary.LittleEndian.Uint32(b[12:]), binary.LittleEndian.Uint32(b[16:])
	}

	// Short: 10 tokens - 3 at a fixed time.
	key := "enc:" + randomTag()
	lim := drip.Limit{Rate: 1, Period: time.Hour, Burst: 10}
	if d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 3}); err != nil || !d.Allowed {
		t.Fatalf("take: %+v, %v", d, err)
	}
	if tok, sec, nsec := short(get(key)); tok != 7e6 || sec != 1_700_000_000 || nsec != 250 {
		t.Fatalf("stored tokens, s, n = %v, %v, %v; want 7e6, 1.7e9, 250", tok, sec, nsec)
	}

	// Below zero tokens (a reservation): a negative integer.
	if d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 9, Reserve: true}); err != nil || !d.Allowed {
		t.Fatalf("reserve: %+v, %v", d, err)
	}
	if tok, _, _ := short(get(key)); tok != -2e6 {
		t.Fatalf("stored tokens %d after a reservation, want -2e6", tok)
	}

	// Compact, as a bucket written by earlier versions: read as such (4.5
	// tokens at the same instant, a deadline in 2100), and rewritten short.
	compactV := make([]byte, 20)
	compactV[0] = 1
	binary.LittleEndian.PutUint64(compactV[1:], 4.5e6) // 7 bytes of it stay
	binary.LittleEndian.PutUint32(compactV[8:], 1_700_000_000)
	binary.LittleEndian.PutUint32(compactV[12:], 250)
	binary.LittleEndian.PutUint32(compactV[16:], 4_102_444_800)
	set(key, string(compactV))
	d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 1})
	if err != nil || !d.Allowed || d.Remaining != 3 {
		t.Fatalf("take on a compact bucket of 4.5 tokens: %+v, %v; want allowed, 3 remaining (3.5)", d, err)
	}
	if tok, _, _ := short(get(key)); tok != 3.5e6 {
		t.Fatalf("rewritten with %d tokens, want 3.5e6", tok)
	}

	// Binary, as a bucket written by earlier versions: read as such, and
	// rewritten short.
	legacy := make([]byte, 33)
	for i, f := range []float64{4.5e6, 1_700_000_000, 250, 0} {
		binary.LittleEndian.PutUint64(legacy[1+8*i:], math.Float64bits(f))
	}
	set(key, string(legacy))
	d, err = storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 1})
	if err != nil || !d.Allowed || d.Remaining != 3 {
		t.Fatalf("take on a binary bucket of 4.5 tokens: %+v, %v; want allowed, 3 remaining (3.5)", d, err)
	}
	if tok, _, _ := short(get(key)); tok != 3.5e6 {
		t.Fatalf("rewritten with %d tokens, want 3.5e6", tok)
	}

	// Decimal, as a bucket written before the binary form: read as such,
	// and rewritten short.
	set(key, "4500000 1700000000 250 0")
	d, err = storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 1})
	if err != nil || !d.Allowed || d.Remaining != 3 {
		t.Fatalf("take on a decimal bucket of 4.5 tokens: %+v, %v; want allowed, 3 remaining (3.5)", d, err)
	}
	short(get(key))

	// Tokens beyond 32 bits (2,147 tokens and more): compact, with the
	// TTL's end in the server's seconds, rounded down.
	key = "enc:" + randomTag()
	wide := drip.Limit{Rate: 1, Period: time.Hour, Burst: 5000}
	if d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: wide, Cost: 1}); err != nil || !d.Allowed {
		t.Fatalf("take: %+v, %v", d, err)
	}
	tok, sec, nsec, dl := compact(get(key))
	if tok != 4999e6 || sec != 1_700_000_000 || nsec != 250 {
		t.Fatalf("stored tokens, s, n = %v, %v, %v; want 4999e6, 1.7e9, 250", tok, sec, nsec)
	}
	ms, err := c.Do(ctx, c.B().Pexpiretime().Key("drip:"+key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	if int64(dl) != ms/1000 {
		t.Fatalf("stored deadline %d s, the TTL ends at %d ms", dl, ms)
	}

	// A time before 1970 (s < 0): the binary form.
	key = "enc:" + randomTag()
	if d, err := storetest.Apply(ctx, s, bucket.Take, time.Unix(-5, 7), drip.Request{Key: key, Limit: lim, Cost: 3}); err != nil || !d.Allowed {
		t.Fatalf("take: %+v, %v", d, err)
	}
	v := get(key)
	if len(v) != 33 || v[0] != 0 {
		t.Fatalf("stored %q: want a zero byte and 32 bytes of doubles", v)
	}
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[1+8*i:]))) }
	if f(0) != 7e6 || f(1) != -5 || f(2) != 7 {
		t.Fatalf("stored tokens, s, n = %v, %v, %v; want 7e6, -5, 7", f(0), f(1), f(2))
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

// TestShortKeepsTTL: a write on a bucket in the short form, which holds
// no TTL deadline, reads the key's own and keeps it when it lasts long
// enough (SET ... KEEPTTL), as it does with the deadline of the compact
// form.
func TestShortKeepsTTL(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t))
	c := s.Client()
	ctx := context.Background()
	key := "enc:" + randomTag()
	lim := drip.PerSecond(1000) // full again at once: a TTL of minutes is enough
	apply := func(op bucket.Op) {
		t.Helper()
		if d, err := storetest.Apply(ctx, s, op, time.Time{}, drip.Request{Key: key, Limit: lim, Cost: 1}); err != nil || !d.Allowed {
			t.Fatalf("%v: %+v, %v", op, d, err)
		}
	}
	apply(bucket.Take)
	// Ten days: only a kept TTL is still longer than a day after the next
	// write (a TTL set afresh is minutes).
	if err := c.Do(ctx, c.B().Pexpire().Key("drip:"+key).Milliseconds(10*24*3600*1000).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// A take (the fast path), then a refund (the general one).
	for _, op := range []bucket.Op{bucket.Take, bucket.Refund} {
		apply(op)
		pttl, err := c.Do(ctx, c.B().Pttl().Key("drip:"+key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if pttl < 24*3600*1000 {
			t.Fatalf("TTL %d ms after a %v on a key that had ten days: want it kept", pttl, op)
		}
	}
}

// TestEncodingBlocksUpgrade reads a bucket with a live block of leased
// tokens in the binary form of earlier versions (the bucket, a newline,
// "id size s n"): a plain take obeys the block's cap, and the key is
// rewritten in the short form with the block after it.
func TestEncodingBlocksUpgrade(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t))
	c := s.Client()
	ctx := context.Background()
	at := time.Unix(1_700_000_000, 250)
	key := "enc:" + randomTag()
	legacy := make([]byte, 33)
	for i, f := range []float64{10e6, 1_700_000_000, 250, 0} {
		binary.LittleEndian.PutUint64(legacy[1+8*i:], math.Float64bits(f))
	}
	// A block of 6 tokens live for an hour: 4 of the 10 are left to
	// plain takes.
	v := string(legacy) + "\nb1 6000000 1700003600 250"
	if err := c.Do(ctx, c.B().Set().Key("drip:"+key).Value(v).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	lim := drip.Limit{Rate: 1, Period: time.Hour, Burst: 10}
	if d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 5}); err != nil || d.Allowed {
		t.Fatalf("take of 5 beside a block of 6 of 10: %+v, %v; want denied", d, err)
	}
	if d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 3}); err != nil || !d.Allowed {
		t.Fatalf("take of 3 beside a block of 6 of 10: %+v, %v; want allowed", d, err)
	}
	got, err := c.Do(ctx, c.B().Get().Key("drip:"+key).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < 13 || got[0] < 128 || got[12:] != "\nb1 6000000 1700003600 250" {
		t.Fatalf("rewritten as %q, want the short form and the block", got)
	}
	if d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 2}); err != nil || d.Allowed {
		t.Fatalf("take of 2 after 3 of 4: %+v, %v; want denied", d, err)
	}
}

// TestSlidingEncoding: a sliding window's value is "+" and its decimals,
// which no bucket's form starts with, so that a key whose limit changes
// between a bucket and a sliding window reads the other's value as no
// state (docs/semantics.md, "When a limit changes"). A value without the
// "+", written by earlier versions, is still read as the window's counts,
// unless its first number is beyond 2^53: that is a bucket in decimals.
func TestSlidingEncoding(t *testing.T) {
	s := open(t, testserver.SharedRedisURL(t))
	c := s.Client()
	ctx := context.Background()
	at := time.Unix(1_700_000_000, 0) // slot 340,000,000 of 5 s
	lim := drip.Limit{Algorithm: drip.SlidingWindow, Rate: 10, Period: 10 * time.Second, Slots: 2}
	for _, tc := range []struct {
		name, stored string
		tokens       float64 // after a take of 1
	}{
		{"an earlier version's counts", "340000000 0 1000000 6000000", 2},
		{"counts", "+340000000 0 1000000 6000000", 2},
		{"a bucket in decimals", "90071992547409930 1700000000 0 1700000060000", 9},
		{"a bucket in the short form", "\x80\x00\x00\x00\x65\x53\xf1\x00\x00\x98\x96\x80", 9},
	} {
		key := "slide:" + randomTag()
		if err := c.Do(ctx, c.B().Set().Key("drip:"+key).Value(tc.stored).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		d, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 1})
		if err != nil || !d.Allowed || d.Tokens != tc.tokens {
			t.Errorf("%s: take %+v, %v; want allowed, %v tokens", tc.name, d, err, tc.tokens)
			continue
		}
		want := "+340000000 0 1000000 7000000"
		if tc.tokens == 9 {
			want = "+340000000 0 0 1000000" // afresh
		}
		if v, err := c.Do(ctx, c.B().Get().Key("drip:"+key).Build()).ToString(); err != nil || v != want {
			t.Errorf("%s: stored %q (%v), want %q", tc.name, v, err, want)
		}
	}
}
