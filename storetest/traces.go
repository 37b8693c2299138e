package storetest

import (
	"bufio"
	"bytes"
	"embed"
	"encoding/json"
	"path"
	"strings"
	"testing"

	"github.com/driplimit/drip/replay"
)

// Traces holds the replay traces (testdata/*.jsonl) and their golden
// outputs (testdata/*.golden), which storetest's own tests check against
// the exact Model.
//
//go:embed testdata
var Traces embed.FS

// TraceNames lists the traces, without extension.
func TraceNames() []string {
	ents, _ := Traces.ReadDir("testdata")
	var names []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".jsonl"); ok {
			names = append(names, n)
		}
	}
	return names
}

// ReadTrace returns a trace's input and golden output lines.
func ReadTrace(name string) (in, golden []string) {
	read := func(p string) []string {
		b, err := Traces.ReadFile(path.Join("testdata", p))
		if err != nil {
			return nil
		}
		var lines []string
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); l != "" {
				lines = append(lines, l)
			}
		}
		return lines
	}
	return read(name + ".jsonl"), read(name + ".golden")
}

// RunTraces replays every trace on the store and compares each output line
// with the golden output: decisions must be identical; an error line must
// be an error line that contains the golden message.
func RunTraces(t *testing.T, newStore NewStore) {
	for _, name := range TraceNames() {
		t.Run(name, func(t *testing.T) {
			st := newStore(t)
			in, golden := ReadTrace(name)
			if len(in) != len(golden) {
				t.Fatalf("trace %s: %d lines but %d golden lines", name, len(in), len(golden))
			}
			var out bytes.Buffer
			if err := replay.RunAt(ctx(t), st, base(), prefix(), strings.NewReader(strings.Join(in, "\n")), &out); err != nil {
				t.Fatal(err)
			}
			got := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(got) != len(golden) {
				t.Fatalf("trace %s: %d output lines, want %d", name, len(got), len(golden))
			}
			for i := range golden {
				if !SameLine(got[i], golden[i]) {
					t.Errorf("trace %s line %d: %s\n got  %s\n want %s", name, i+1, in[i], got[i], golden[i])
				}
			}
		})
	}
}

// SameLine compares two replay output lines: identical, or both errors
// with got's message containing want's.
func SameLine(got, want string) bool {
	if got == want {
		return true
	}
	var g, w struct {
		Error *string `json:"error"`
	}
	if json.Unmarshal([]byte(got), &g) != nil || json.Unmarshal([]byte(want), &w) != nil {
		return false
	}
	return g.Error != nil && w.Error != nil && strings.Contains(*g.Error, *w.Error)
}
