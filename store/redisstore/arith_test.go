package redisstore

import (
	"context"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/redis/rueidis"

	"github.com/driplimit/drip/internal/testkit/testserver"
)

// TestLuaArithmetic holds bigint.lua to math/big on extreme operands:
// around 2^52, 2^53, 2^63 and beyond, of both signs, where a double
// alone would round.
func TestLuaArithmetic(t *testing.T) {
	src, err := os.ReadFile("testdata/arith.lua")
	if err != nil {
		t.Fatal(err)
	}
	script := rueidis.NewLuaScript(bigintLua + "\n" + string(src))
	o, err := rueidis.ParseURL(testserver.SharedRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	rng := rand.New(rand.NewPCG(1, 2))
	edges := []int64{0, 1, 2, 3, 1000, 1e7, 1e9, 1<<24 - 1, 1 << 24, 1<<48 + 7, 1<<52 - 1, 1 << 52, 1<<52 + 1,
		1<<53 - 1, 1 << 53, 1<<53 + 1, 1<<53 + 3, 1e15, 1e16, 1e18, 1.7e18 + 123456789, 1<<62 + 1, math.MaxInt64 - 1, math.MaxInt64}
	operand := func() int64 {
		var v int64
		switch rng.IntN(3) {
		case 0:
			v = edges[rng.IntN(len(edges))]
		case 1:
			v = rng.Int64()
		default:
			v = rng.Int64N(1 << uint(rng.IntN(62)+1))
		}
		if rng.IntN(3) == 0 {
			v = -v
		}
		return v
	}
	positive := func() int64 {
		for {
			if v := operand(); v > 0 {
				return v
			}
		}
	}
	check := func(op string, args []string, want ...string) {
		t.Helper()
		got, err := script.Exec(ctx, c, nil, append([]string{op}, args...)).AsStrSlice()
		if err != nil {
			t.Fatalf("%s %v: %v", op, args, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s %v = %v, want %v", op, args, got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s %v = %v, want %v", op, args, got, want)
			}
		}
	}
	bi := func(v int64) *big.Int { return big.NewInt(v) }
	for range 2000 {
		a, b := operand(), operand()
		as, bs := bi(a).String(), bi(b).String()
		check("add", []string{as, bs}, new(big.Int).Add(bi(a), bi(b)).String())
		check("sub", []string{as, bs}, new(big.Int).Sub(bi(a), bi(b)).String())
		check("mul", []string{as, bs}, new(big.Int).Mul(bi(a), bi(b)).String())
		check("cmp", []string{as, bs}, big.NewInt(int64(bi(a).Cmp(bi(b)))).String())
		d := positive()
		q, m := new(big.Int).DivMod(bi(a), bi(d), new(big.Int)) // Euclidean = floor for d > 0
		check("divmod", []string{as, bi(d).String()}, q.String(), m.String())
		// The continuous refill's shape: floor(e*rate/period) and the
		// remainder, with a 127-bit product.
		e, r := positive(), positive()
		p := new(big.Int).Mul(bi(e), bi(r))
		q, m = new(big.Int).DivMod(p, bi(d), new(big.Int))
		check("muldivmod", []string{bi(e).String(), bi(r).String(), bi(d).String()}, q.String(), m.String())
	}
}
