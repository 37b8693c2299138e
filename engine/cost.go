package engine

import (
	"math"
	"strconv"
)

// maxCost bounds a cost read from a request, as drip bounds amounts.
const maxCost = 1e12

// ParseCost reads a request's cost: a plain decimal number >= 0 ("5",
// "2.5"), with optional surrounding spaces. Anything else (a sign, an
// exponent, "NaN", "Inf", a number above 1e12, text) is not a cost, and
// the rule's default_cost applies.
func ParseCost(s string) (float64, bool) {
	s, ok := plainDecimal(s)
	if !ok || len(s) > 32 {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f > maxCost {
		return 0, false
	}
	return f, true
}

// ParseUsage reads the cost a response reports (cost_from_response): a
// plain decimal number, as ParseCost reads it, of any length. One above
// 1e12, the largest amount drip counts, is 1e12: a larger report never
// charges less than a smaller one.
func ParseUsage(s string) (float64, bool) {
	s, ok := plainDecimal(s)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !math.IsInf(f, 1) {
		return 0, false
	}
	return min(f, maxCost), true
}

// plainDecimal trims s's surrounding spaces and tabs and reports whether
// what is left is digits with at most one dot between them.
func plainDecimal(s string) (string, bool) {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	if s == "" {
		return "", false
	}
	digits, dot := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case '0' <= c && c <= '9':
			digits++
		case c == '.' && !dot && digits > 0 && i < len(s)-1:
			dot = true
		default:
			return "", false
		}
	}
	return s, true
}
