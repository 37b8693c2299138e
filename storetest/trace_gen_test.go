package storetest

import (
	"bytes"
	"flag"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/store/memstore"
)

var update = flag.Bool("update", false, "rewrite the generated traces (random-*) and their golden outputs, each checked against the exact model first; the hand-checked goldens are never rewritten")

// TestGolden checks that the memory store reproduces every golden output.
// With -update it rewrites the generated traces (random-*) and their
// goldens from the memory store, once the exact model agrees with them;
// the other goldens (seed000, seed004, errors) were checked by hand and
// are never rewritten. TestGoldenExact checks every golden against the
// exact model on every run.
func TestGolden(t *testing.T) {
	if *update {
		for i, seed := range []uint64{1, 2, 3} {
			var b strings.Builder
			for _, l := range RandomLines(seed, 400) {
				b.WriteString(encodeLine(l) + "\n")
			}
			name := filepath.Join("testdata", fmt.Sprintf("random-%d.jsonl", i+1))
			if err := os.WriteFile(name, []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	entries, _ := os.ReadDir("testdata")
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".jsonl")
		if !ok {
			continue
		}
		in, _ := os.ReadFile(filepath.Join("testdata", e.Name()))
		st := memstore.New()
		var out bytes.Buffer
		if err := replay.RunAt(t.Context(), st, base(), "g:", bytes.NewReader(in), &out); err != nil {
			t.Fatal(err)
		}
		st.Close()
		gp := filepath.Join("testdata", name+".golden")
		if *update && strings.HasPrefix(name, "random-") {
			lines := func(b []byte) []string { return strings.Split(strings.TrimSpace(string(b)), "\n") }
			checkWithModel(t, name, lines(in), lines(out.Bytes()))
			if t.Failed() {
				t.Fatalf("%s: the memory store's output disagrees with the exact model: golden not written", name)
			}
			if err := os.WriteFile(gp, out.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, _ := os.ReadFile(gp)
		if !bytes.Equal(out.Bytes(), want) {
			t.Errorf("%s: the memory store's output differs from the golden file (go test ./storetest -run TestGolden -update)", name)
		}
	}
}

// TestGoldenAgreesWithModel replays the random traces' lines on the exact
// model and checks the golden decisions against it.
func TestGoldenAgreesWithModel(t *testing.T) {
	for i, seed := range []uint64{1, 2, 3} {
		st := memstore.New()
		CompareWithModel(t, st, RandomLines(seed, 400))
		st.Close()
		in, golden := ReadTrace(fmt.Sprintf("random-%d", i+1))
		if len(in) != 400 || len(golden) != 400 {
			t.Fatalf("random-%d: %d lines, %d golden", i+1, len(in), len(golden))
		}
		for j, l := range RandomLines(seed, 400) {
			if encodeLine(l) != in[j] {
				t.Fatalf("random-%d line %d is not what RandomLines(%d) gives: regenerate with -update", i+1, j+1, seed)
			}
		}
	}
}

// TestModelWorkedExample holds the model itself to the boundary example of
// docs/semantics.md (10/s: 0.1 s after the bucket emptied, a take passes).
func TestModelWorkedExample(t *testing.T) {
	m := NewModel()
	params, _ := drip.PerSecond(10).Params("k")
	p := bucket.Prepared{Key: "k", Params: params, Cost: 10 * bucket.Micro}
	at := time.Unix(100, 0)
	if d := m.Apply(bucket.Take, p, at, true, nil, nil); !d.Allowed || d.Tokens.Sign() != 0 {
		t.Fatalf("burst: %+v", d)
	}
	p.Cost = bucket.Micro
	if d := m.Apply(bucket.Take, p, at.Add(100*time.Millisecond), true, nil, nil); !d.Allowed || d.Tokens.Cmp(big.NewRat(0, 1)) != 0 {
		t.Fatalf("0.1 s later: %+v", d)
	}
}
