// Package strictjson refuses what encoding/json would accept quietly, so
// that every JSON document drip reads (the decision API's bodies, replay
// lines, the admin API's limits) has one reading.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// Check refuses what encoding/json would accept quietly, so that every
// document has one reading (two programs that parse it agree on it):
//   - invalid UTF-8, which encoding/json turns into U+FFFD, so that two
//     different keys would name one bucket; and escapes that are not
//     characters (a lone surrogate, "\ud800"), which it treats the same;
//   - a field given twice in one object (encoding/json keeps the last);
//   - a field name not written exactly as drip spells its fields, in lower
//     case ASCII: encoding/json matches "KEY", and even "\u212aey" (with
//     the Kelvin sign), to "key". The names inside an object that is the
//     value of a field called free (unless free is "") are not drip's and
//     are left as they are, duplicates aside (the rules' "values");
//   - arrays and objects nested more than maxDepth deep: no document drip
//     reads is nested more than four deep, and the check walks one level
//     per nesting, so that a 256 KiB body of "[[[[..." would otherwise
//     hold a goroutine stack of a hundred megabytes.
//
// Syntax errors are left to encoding/json, which the caller runs next.
func Check(b []byte, free string) error {
	if !utf8.Valid(b) {
		return errors.New("not valid UTF-8")
	}
	if err := checkEscapes(b); err != nil {
		return err
	}
	if err, sure := fastCheck(b, free); sure {
		return err
	}
	return slowCheck(b, free)
}

// slowCheck is the walk over a token stream, for any document.
func slowCheck(b []byte, free string) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	err := walk(dec, free, false, 0)
	var se *json.SyntaxError
	if errors.As(err, &se) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// maxDepth is how deep arrays and objects may nest in a document.
const maxDepth = 16

// walk reads one value from dec, depth arrays and objects deep, and checks
// the names of its objects; isFree says the names of this object are not
// drip's.
func walk(dec *json.Decoder, free string, isFree bool, depth int) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); ok && (d == '[' || d == '{') && depth >= maxDepth {
		return fmt.Errorf("arrays and objects nested more than %d deep", maxDepth)
	}
	switch t {
	case json.Delim('['):
		for dec.More() {
			if err := walk(dec, free, false, depth+1); err != nil {
				return err
			}
		}
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return err
			}
			name, _ := k.(string)
			if seen[name] {
				return errors.New("field " + quote(name) + " given twice")
			}
			seen[name] = true
			if !isFree && !plainName(name) {
				return errors.New("unknown field " + quote(name) + " (field names are in lower case)")
			}
			if err := walk(dec, free, !isFree && free != "" && name == free, depth+1); err != nil {
				return err
			}
		}
	default:
		return nil // a scalar
	}
	_, err = dec.Token() // the closing delimiter
	return err
}

// checkEscapes refuses a \u escape that is not a character: a surrogate
// that is not the first half of a pair directly followed by its second
// half. Backslashes occur only inside strings, each escaping the next byte.
func checkEscapes(b []byte) error {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		i++
		if i >= len(b) || b[i] != 'u' {
			continue
		}
		r, ok := hex4(b, i+1)
		if !ok {
			continue // encoding/json reports a bad escape itself
		}
		i += 4
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return errLoneSurrogate
		case r >= 0xD800 && r <= 0xDBFF:
			if i+2 >= len(b) || b[i+1] != '\\' || b[i+2] != 'u' {
				return errLoneSurrogate
			}
			if r2, ok := hex4(b, i+3); !ok || r2 < 0xDC00 || r2 > 0xDFFF {
				return errLoneSurrogate
			}
			i += 6
		}
	}
	return nil
}

var errLoneSurrogate = errors.New(`a \u escape is not a character (a lone surrogate)`)

// hex4 reads four hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// plainName reports whether name is spelled as drip's field names are:
// lower case ASCII letters, digits and underscores.
func plainName[T string | []byte](name T) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return len(name) > 0
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
