package rules

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// PathError is a request path that servers read in different ways, which
// could dodge a rule on the path. CleanPath refuses it; the front doors
// answer 400.
type PathError struct{ msg string }

func (e *PathError) Error() string { return "ambiguous request path: " + e.msg }

var (
	errPathEscape    = &PathError{"it is not valid percent-encoding"}
	errPathControl   = &PathError{"it holds a control character (such as %00 or %0A) once decoded"}
	errPathBackslash = &PathError{`it holds a backslash (\ or %5C), which some servers read as a slash`}
	errPathTwice     = &PathError{"it is encoded twice (%25 before an escape, as in %2561): a server that decodes it twice reads another path"}
	errPathUTF8      = &PathError{"it is not UTF-8 once decoded (overlong forms such as %C0%AE are read as '.' by some servers)"}
	errPathSlashDots = &PathError{`it holds an encoded slash (%2F) and a "." or ".." segment: servers differ on whether ".." crosses it`}
	errPathDots      = &PathError{`a segment of it is dots and spaces only (such as "..." or ".. "), which some servers read as "." or ".."`}
)

// CleanPath returns the path that rules match and key on. escaped is the
// path as sent, percent-encoded: for a Go server, the URL's RawPath, else
// EscapedPath(). It reads the path as application servers route it, so
// no other spelling dodges a rule:
//
//   - percent-escapes are decoded once ("/%61pi" is "/api"; an encoded
//     slash is a slash);
//   - each segment loses its parameters, from a ';' on, as servlet
//     containers drop them ("/api;jsessionid=1/x" is "/api/x");
//   - unless the set's ExactPaths, each segment loses its trailing dots
//     and spaces, as Windows drops them ("/api./x" and "/api%20/x" are
//     "/api/x"), and the path is folded to lower case (FoldPath);
//   - "." and ".." segments are resolved as RFC 3986 says, after the
//     parameters are gone ("/x/..;/api" is "/api"); a path that ends in
//     one keeps a trailing slash ("/api/x/.." is "/api/"), as it keeps its
//     own;
//   - empty segments are dropped ("//api//x" is "/api/x").
//
// A path that servers read differently is a *PathError: one that holds a
// control character or a backslash once decoded, one encoded twice ("%25"
// decoding to another escape), one that is not UTF-8 once decoded, one
// that holds both an encoded slash and a dot segment, and (unless
// ExactPaths) one with a segment of only dots and spaces other than "."
// and "..". The path "*" (of OPTIONS *) is kept as it is; one not
// beginning with '/' is read as if it did.
func (s *Set) CleanPath(escaped string) (string, error) {
	exact := s != nil && s.ExactPaths
	switch {
	case escaped == "":
		return "/", nil
	case escaped == "*":
		return escaped, nil
	case escaped[0] != '/':
		escaped = "/" + escaped
	}
	if isClean(escaped, exact) {
		return escaped, nil // the common case: nothing to do, nothing allocated
	}
	p, encodedSlash, err := decodePath(escaped)
	if err != nil {
		return "", err
	}
	return cleanSegments(p, encodedSlash, exact)
}

// cleanSegments is CleanPath's reading of a decoded path p beginning
// with '/', of which encodedSlash says whether a slash was sent encoded.
func cleanSegments(p string, encodedSlash, exact bool) (string, error) {
	segs := strings.Split(p[1:], "/")
	out := make([]string, 0, len(segs))
	dir := false // the last segment leaves a directory: a trailing slash
	dots := false
	for _, seg := range segs {
		seg, _, _ = strings.Cut(seg, ";")
		if !exact && seg != "." && seg != ".." {
			trimmed := strings.TrimRight(seg, ". ")
			if trimmed == "" && strings.Contains(seg, ".") {
				return "", errPathDots
			}
			seg = trimmed
		}
		dir = true
		switch seg {
		case "":
		case ".":
			dots = true
		case "..":
			dots = true
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, seg)
			dir = false
		}
	}
	if dots && encodedSlash {
		return "", errPathSlashDots
	}
	clean := "/" + strings.Join(out, "/")
	if dir && len(out) > 0 {
		clean += "/"
	}
	if !exact {
		clean = FoldPath(clean)
	}
	return clean, nil
}

// isClean reports whether CleanPath would return p as it is: a path of
// lower-case letters (any case when exact), digits and the characters
// that need no decoding, without empty segments, dot segments or
// segments ending in a dot.
func isClean(p string, exact bool) bool {
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '/':
			if i > 0 && (p[i-1] == '/' || p[i-1] == '.') {
				return false
			}
		case c == '.':
			if i+1 == len(p) {
				return false
			}
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case 'A' <= c && c <= 'Z':
			if !exact {
				return false
			}
		case strings.IndexByte("-_~!$&'()*+,=:@", c) >= 0:
		default:
			return false // '%', ';', '\', a space, a control character, non-ASCII
		}
	}
	return true
}

// decodePath decodes the percent-escapes of p once, and says whether one
// of them was a slash. It refuses what servers read differently once
// decoded (PathError).
func decodePath(p string) (string, bool, error) {
	var b strings.Builder
	b.Grow(len(p))
	encodedSlash := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '%' {
			if i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
				return "", false, errPathEscape
			}
			c = unhex(p[i+1])<<4 | unhex(p[i+2])
			i += 2
			if c == '/' {
				encodedSlash = true
			}
		}
		b.WriteByte(c)
	}
	d := b.String()
	if err := checkDecoded(d); err != nil {
		return "", false, err
	}
	return d, encodedSlash, nil
}

// checkDecoded refuses a decoded path that servers read differently:
// with a control character, a backslash, an escape left (it was encoded
// twice), or bytes that are not UTF-8.
func checkDecoded(d string) error {
	for i := 0; i < len(d); i++ {
		switch c := d[i]; {
		case c < 0x20 || c == 0x7f:
			return errPathControl
		case c == '\\':
			return errPathBackslash
		case c == '%' && i+2 < len(d) && isHex(d[i+1]) && isHex(d[i+2]):
			return errPathTwice
		}
	}
	if !utf8.ValidString(d) {
		return errPathUTF8
	}
	return nil
}

// matchProblem says why a rules file's path match v (a prefix when
// prefix, as "/api/" of "/api/*"), already folded unless exact, can never
// hold for a path as CleanPath reads it, or "" when it can: a match
// written "/api//x", "/api/./x", "/admin;v=1" or (unless exact) "/api./x"
// would be a rule that silently never applies.
func matchProblem(v string, prefix, exact bool) string {
	if v == "*" && !prefix || v == "" && prefix {
		return "" // OPTIONS *; every path
	}
	probe := v
	if prefix {
		probe += "x" // a last segment that goes on
	}
	if !strings.HasPrefix(probe, "/") {
		return "never matches: a request's path begins with /"
	}
	err := checkDecoded(probe)
	clean := ""
	if err == nil {
		clean, err = cleanSegments(probe, false, exact)
	}
	if err != nil {
		return "never matches: a request with such a path is refused, since " + err.(*PathError).msg
	}
	if clean == probe {
		return ""
	}
	if prefix {
		clean = strings.TrimSuffix(clean, "x") + "*"
	}
	return "never matches: a request's path is read as " + strconv.Quote(clean)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// FoldPath folds p's case for paths compared case-insensitively. Paths
// that strings.EqualFold finds equal fold alike: "/API" and "/api", and
// also the Kelvin sign and 'k'. CleanPath does it last. A rules file's
// path matches go through it when loaded, unless ExactPaths.
func FoldPath(p string) string {
	ascii, upper := true, false
	for i := 0; i < len(p); i++ {
		c := p[i]
		ascii = ascii && c < utf8.RuneSelf
		upper = upper || 'A' <= c && c <= 'Z'
	}
	switch {
	case ascii && !upper:
		return p
	case ascii:
		return strings.ToLower(p)
	}
	return strings.Map(foldRune, p)
}

// foldRune is the one rune of r's case-folding orbit that FoldPath
// writes: the lower case of its smallest member.
func foldRune(r rune) rune {
	least := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		least = min(least, f)
	}
	return unicode.ToLower(least)
}

// CleanMethod returns the method that rules match and key on: in upper
// case, as servers that match methods case-insensitively read it. A rule
// on POST is not dodged by "post".
func CleanMethod(m string) string {
	for i := 0; i < len(m); i++ {
		if 'a' <= m[i] && m[i] <= 'z' {
			return strings.ToUpper(m)
		}
	}
	return m
}
