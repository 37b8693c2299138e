package replay

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/strictjson"
)

// fullDecode is Decode without its fast path: the strict check, then
// encoding/json.
func fullDecode(b []byte, f Format) (Raw, error) {
	if err := strictjson.Check(b, "values"); err != nil {
		return Raw{}, inputf("bad JSON: %w", err)
	}
	return decodeJSON(b, f)
}

// TestDecodeFastAgrees: on random and hostile bodies, Decode (with its
// hand-written path for the common body) gives what the full path gives,
// request and error alike; and the fast path does read the common bodies.
func TestDecodeFastAgrees(t *testing.T) {
	common := []string{
		`{"key": "user:1", "limit": {"rate": 1000000, "burst": 1000000}}`,
		`{"key":"a","cost":2.5,"reserve":true,"lease":"l-1","limit":{"burst":20,"rate":10}}`,
		` {"limit": {"rate": 0.5}, "key": "k", "cost": 0} ` + "\n",
		`{"key": "ключ", "cost": -0, "limit": {"rate": 1e3, "burst": 1E-3}}`,
		`{"key": "k", "reserve": false, "limit": {"rate": -1, "burst": 12345678901234567890}}`,
	}
	hostile := []string{
		`{"key": "k", "limit": {"rate": 1, "burst": 0}}`,
		`{"key": "k", "limit": {"rate": 1, "burst": -1}}`,
		`{"key": "k", "limit": {"rate": 1e400, "burst": 1}}`,
		`{"key": "k", "cost": 1e999, "limit": {"rate": 1}}`,
		`{"key": "k", "cost": 01, "limit": {"rate": 1}}`,
		`{"key": "k", "cost": +1, "limit": {"rate": 1}}`,
		`{"key": "k", "cost": 1., "limit": {"rate": 1}}`,
		`{"key": "k", "cost": .5, "limit": {"rate": 1}}`,
		`{"key": "k", "cost": 0x10, "limit": {"rate": 1}}`,
		`{"key": "k", "cost": Infinity, "limit": {"rate": 1}}`,
		`{"key": "k", "cost": "1", "limit": {"rate": 1}}`,
		`{"key": "k", "cost": null, "limit": {"rate": 1}}`,
		`{"key": null, "limit": {"rate": 1}}`,
		`{"key": "k", "limit": null}`,
		`{"key": "k", "limit": {}}`,
		`{"key": "k", "limit": {"rate": 1, "period": "1s"}}`,
		`{"key": "k", "limit": {"Rate": 1}}`,
		`{"key": "k", "limit": {"rate": 1, "rate": 2}}`,
		`{"key": "k", "key": "j", "limit": {"rate": 1}}`,
		`{"KEY": "k", "limit": {"rate": 1}}`,
		`{"ke\u0079": "k", "limit": {"rate": 1}}`,
		`{"key": "k\u0000", "limit": {"rate": 1}}`,
		`{"key": "k\ud800", "limit": {"rate": 1}}`,
		`{"key": "k\ud83d\ude00", "limit": {"rate": 1}}`,
		`{"key": "k\n", "limit": {"rate": 1}}`,
		"{\"key\": \"k\x01\", \"limit\": {\"rate\": 1}}",
		"{\"key\": \"k\xff\", \"limit\": {\"rate\": 1}}",
		`{"key": "k", "limit": {"rate": 1}} {}`,
		`{"key": "k", "limit": {"rate": 1}}}`,
		`{"key": "k", "limit": {"rate": 1},}`,
		`{"key": "k", "limit": {"rate": 1,}}`,
		`{"key": "k" "limit": {"rate": 1}}`,
		`{"key": "k", "limit": {"rate": 1}`,
		`{"key": "k", "reserve": True, "limit": {"rate": 1}}`,
		`{"key": "k", "reserve": 1, "limit": {"rate": 1}}`,
		`{"key": "k", "reserve": truex, "limit": {"rate": 1}}`,
		`{"key": "k", "at": 1, "limit": {"rate": 1}}`,
		`{"key": "k", "op": "peek", "limit": {"rate": 1}}`,
		`{"rule": "free", "values": ["a"]}`,
		`{"requests": [{"key": "k", "limit": {"rate": 1}}]}`,
		`{}`, ``, ` `, `null`, `[]`, `"key"`, `{"key": "k", "limit": [1]}`,
		`{"key": "k", "limit": {"rate": 1, "burst": 1, "extra": {}}}`,
		`{"key": "k", "limit": {"rate": 1}, "lease": 5}`,
	}
	rng := rand.New(rand.NewPCG(30, 3))
	var bodies []string
	bodies = append(bodies, common...)
	bodies = append(bodies, hostile...)
	for range 20000 {
		bodies = append(bodies, randomBody(rng))
	}
	for range 20000 {
		b := []byte(common[rng.IntN(len(common))])
		const alphabet = "{}[]\":,0123456789.eE+-tfnul \\xkKaeryimtbos\x00\xff"
		for range 1 + rng.IntN(3) {
			if len(b) == 0 {
				break
			}
			switch i := rng.IntN(len(b)); rng.IntN(3) {
			case 0: // a byte changed
				b[i] = alphabet[rng.IntN(len(alphabet))]
			case 1: // a byte dropped
				b = append(b[:i], b[i+1:]...)
			default: // a byte doubled
				b = append(b[:i+1], b[i:]...)
			}
		}
		bodies = append(bodies, string(b))
	}
	fast := 0
	for _, body := range bodies {
		for _, f := range []Format{BodyFormat, LineFormat} {
			got, gotErr := Decode([]byte(body), f)
			want, wantErr := fullDecode([]byte(body), f)
			if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || !reflect.DeepEqual(got, want) {
				t.Fatalf("%s (%s): Decode %+v, %v; the full path %+v, %v", body, f.Unit, got, gotErr, want, wantErr)
			}
		}
		if _, ok := decodeFast([]byte(body)); ok {
			fast++
		}
	}
	for _, body := range common {
		if _, ok := decodeFast([]byte(body)); !ok {
			t.Errorf("%s: not read by the fast path", body)
		}
	}
	t.Logf("%d of %d bodies read by the fast path", fast, len(bodies))
	if fast < 1000 {
		t.Errorf("only %d of %d bodies read by the fast path", fast, len(bodies))
	}
}

// randomBody is an object of the request's fields (and a few others) in
// random order, with values of random kinds and spellings.
func randomBody(rng *rand.Rand) string {
	nums := []string{"0", "-0", "1", "2.5", "1e3", "1E-3", "-7", "1e400", "01", "1.", "-", "0.0000001", "123456789012345678901234567890", "null", `"1"`, "true"}
	strs := []string{`"k"`, `"user:42"`, `""`, `"a\"b"`, `"\u00e9"`, `"é"`, `1`, `null`, `"x y"`}
	value := func(name string) string {
		switch name {
		case "key", "lease", "rule":
			return strs[rng.IntN(len(strs))]
		case "reserve":
			return []string{"true", "false", "null", "0", `"true"`}[rng.IntN(5)]
		case "limit":
			var fs []string
			for _, n := range []string{"rate", "burst", "period", "rate", "Rate"} {
				if rng.IntN(2) == 0 {
					fs = append(fs, fmt.Sprintf(`"%s": %s`, n, nums[rng.IntN(len(nums))]))
				}
			}
			if rng.IntN(20) == 0 {
				return "null"
			}
			return "{" + strings.Join(fs, ", ") + "}"
		case "values":
			return `["a"]`
		default:
			return nums[rng.IntN(len(nums))]
		}
	}
	names := []string{"key", "limit", "cost", "reserve", "lease", "key", "limit", "rule", "values", "at", "op", "Key", "burst"}
	var fs []string
	for _, n := range names {
		if rng.IntN(3) == 0 || (n == "key" || n == "limit") && rng.IntN(4) != 0 {
			fs = append(fs, fmt.Sprintf(`%q:%s%s`, n, []string{"", " ", "\n\t"}[rng.IntN(3)], value(n)))
		}
	}
	rng.Shuffle(len(fs), func(i, j int) { fs[i], fs[j] = fs[j], fs[i] })
	return "{" + strings.Join(fs, ",") + "}" + []string{"", " ", "\n", " x", "{}"}[rng.IntN(5)]
}

// BenchmarkDecode: the decision API's common body through Decode (its
// fast path) and through the full path (encoding/json, the limit's own
// decoder), in one run:
//
//	go test -run '^$' -bench Decode -benchmem ./replay/
func BenchmarkDecode(b *testing.B) {
	body := []byte(`{"key": "user:12345", "limit": {"rate": 1000000, "burst": 1000000}}`)
	for _, c := range []struct {
		name   string
		decode func([]byte, Format) (Raw, error)
	}{{"fast", Decode}, {"full", fullDecode}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.decode(body, BodyFormat); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestDecodeKeepsNothing: what Decode returns holds no part of its input,
// on the fast path and the full one, so that the decision API may read
// the next body into the same buffer.
func TestDecodeKeepsNothing(t *testing.T) {
	for _, body := range []string{
		`{"key": "user:1", "lease": "l", "limit": {"rate": 10, "burst": 20}}`,
		`{"key": "us\u0065r:1", "limit": {"rate": 10, "period": "1s", "time_zone": "UTC"}}`,
		`{"rule": "free", "values": {"header:x-api-key": "k-123"}, "lease": "l"}`,
		`{"requests": [{"rule": "free", "values": ["a"]}, {"key": "k", "limit": {"rate": 1}}]}`,
	} {
		b := []byte(body)
		got, err := Decode(b, BodyFormat)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		for i := range b {
			b[i] = 'x'
		}
		want, _ := Decode([]byte(body), BodyFormat)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: after the input was overwritten, %+v; want %+v", body, got, want)
		}
	}
}
