// Package sfv writes the HTTP structured field values (RFC 8941) of drip's
// RateLimit headers, and parses them strictly, so that tests can hold every
// header drip writes to the grammar.
package sfv

import (
	"math"
	"strconv"
	"strings"
)

// String returns name as an sf-string. An sf-string holds printable ASCII
// only, so any other byte (the UTF-8 of a name such as "café", a control
// character) is written as %xx in lowercase hex, and so is "%" itself, so
// that the name can be recovered: "café" is "caf%c3%a9", "50%" is "50%25".
// (This is the escaping of RFC 9651's Display String, kept inside an
// sf-string because the RateLimit headers' names are strings.) A quote and
// a backslash are escaped with a backslash.
func String(name string) string {
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len(name) + 2)
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c == '%' || c < 0x20 || c > 0x7e:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// Number returns x as an sf-integer when it is a whole number, else as an
// sf-decimal, which has at most three decimal places: x is rounded down to
// a thousandth (a quota is never overstated). Amounts in drip are at most
// 1e12, inside both types' range.
func Number(x float64) string {
	if x == math.Trunc(x) && math.Abs(x) < 1e15 {
		return strconv.FormatInt(int64(x), 10)
	}
	s := strconv.FormatFloat(math.Floor(x*1000)/1000, 'f', 3, 64)
	s = strings.TrimRight(s, "0")
	if strings.HasSuffix(s, ".") {
		s += "0"
	}
	return s
}
