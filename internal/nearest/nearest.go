// Package nearest finds the known name closest to a misspelt one, for
// errors that say "did you mean ...?".
package nearest

import "strings"

// Name returns the name in known closest to k, compared without regard
// to case, and its edit distance from k (insertions, deletions and
// substitutions of one byte); ties go to the name first in sort order.
// It returns "" and -1 when known is empty.
func Name(k string, known []string) (string, int) {
	best, bestD := "", -1
	k = strings.ToLower(k)
	for _, s := range known {
		d := Distance(k, strings.ToLower(s))
		if bestD < 0 || d < bestD || d == bestD && s < best {
			best, bestD = s, d
		}
	}
	return best, bestD
}

// Distance is the edit distance of a and b, byte by byte; over 64 bytes
// either way, it is at least 99 (a bound on the work an input can ask).
func Distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return max(99, len(a), len(b))
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
