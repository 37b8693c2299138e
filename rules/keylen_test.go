package rules

import (
	"strings"
	"testing"

	"github.com/driplimit/drip/store"
)

// TestKeysFit: whatever the values, a rule's key fits half of
// store.MaxKeyLen (the rest is room for a store wrapper's prefix), so that
// a store never refuses a key the middleware built; and values that differ
// keep their keys apart.
func TestKeysFit(t *testing.T) {
	var keys []string
	for i := range 12 {
		keys = append(keys, `"header:x-k`+strings.Repeat("a", i)+`"`)
	}
	set, err := Parse([]byte(`{"rules": [{"name": "`+strings.Repeat("r", 100)+`", "limit_keys": [`+strings.Join(keys, ", ")+`],
	  "algorithm_config": {"rps": 1}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	r := set.Rules[0]
	vals := func(last string) []string {
		v := make([]string, len(keys))
		for i := range v {
			v[i] = strings.Repeat("|", 64) // escaped to 128 bytes each
		}
		v[len(v)-1] = last
		return v
	}
	a, b := r.Key(vals("a")), r.Key(vals("b"))
	if len(a) > store.MaxKeyLen/2 || len(b) > store.MaxKeyLen/2 {
		t.Fatalf("keys of %d and %d bytes, want at most %d", len(a), len(b), store.MaxKeyLen/2)
	}
	if a == b {
		t.Fatal("two different values made the same key")
	}
	if short := r.Key(make([]string, len(keys))); !strings.HasPrefix(short, r.Name+"|") {
		t.Fatalf("a short key %q is not kept as it is", short)
	}
}
