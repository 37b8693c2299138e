package engine

import "strconv"

// maxCost bounds a cost read from a request, as drip bounds amounts.
const maxCost = 1e12

// ParseCost reads a request's cost: a plain decimal number >= 0 ("5",
// "2.5"), with optional surrounding spaces. Anything else (a sign, an
// exponent, "NaN", "Inf", a number above 1e12, text) is not a cost, and
// the rule's default_cost applies.
func ParseCost(s string) (float64, bool) {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	if s == "" || len(s) > 32 {
		return 0, false
	}
	digits, dot := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case '0' <= c && c <= '9':
			digits++
		case c == '.' && !dot && digits > 0 && i < len(s)-1:
			dot = true
		default:
			return 0, false
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f > maxCost {
		return 0, false
	}
	return f, true
}
