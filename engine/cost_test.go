package engine

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

func TestParseCost(t *testing.T) {
	good := map[string]float64{"5": 5, "0": 0, "2.5": 2.5, " 7\t": 7, "007": 7, "1000000000000": 1e12}
	for s, want := range good {
		if got, ok := ParseCost(s); !ok || got != want {
			t.Errorf("ParseCost(%q) = %v, %v", s, got, ok)
		}
	}
	for _, s := range []string{"", " ", "abc", "-3", "+3", "NaN", "nan", "Inf", "-Inf", "infinity", "1e3", "0x10", "1_000", ".5", "5.", "1.2.3", "5 5", "1000000000001", strings.Repeat("9", 40)} {
		if got, ok := ParseCost(s); ok {
			t.Errorf("ParseCost(%q) = %v, accepted", s, got)
		}
	}
}

func FuzzParseCost(f *testing.F) {
	for _, s := range []string{"5", "abc", "-3", "NaN", "Inf", "2.5", " 1 ", "1e3", "0x1p4", "1_0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, ok := ParseCost(s)
		if !ok {
			return
		}
		if math.IsNaN(c) || math.IsInf(c, 0) || c < 0 || c > maxCost {
			t.Fatalf("ParseCost(%q) = %v", s, c)
		}
		want, err := strconv.ParseFloat(strings.Trim(s, " \t"), 64)
		if err != nil || want != c {
			t.Fatalf("ParseCost(%q) = %v, strconv says %v %v", s, c, want, err)
		}
	})
}

// TestParseUsage: a reported usage reads as a cost does, except that one
// above the largest amount saturates at it instead of counting as absent:
// a larger report never charges less.
func TestParseUsage(t *testing.T) {
	good := map[string]float64{
		"5": 5, "0": 0, "2.5": 2.5, " 7\t": 7, "1000000000000": 1e12,
		"1000000000001": 1e12, "99999999999999999999": 1e12, "9223372036854775807": 1e12,
		strings.Repeat("9", 400): 1e12, "0." + strings.Repeat("0", 400) + "1": 0,
	}
	for s, want := range good {
		if got, ok := ParseUsage(s); !ok || got != want {
			t.Errorf("ParseUsage(%q) = %v, %v, want %v", s, got, ok, want)
		}
	}
	for _, s := range []string{"", "abc", "-3", "+3", "NaN", "Inf", "1e13", ".5", "5.", "1.2.3", "5 5"} {
		if got, ok := ParseUsage(s); ok {
			t.Errorf("ParseUsage(%q) = %v, accepted", s, got)
		}
	}
}
