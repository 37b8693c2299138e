package strictjson

import (
	"errors"
	"fmt"
)

// fastCheck is walk over the bytes, for the common document: an object,
// valid JSON, no escape in a field name. It reports what walk would, in
// the same order (the first problem in the document), without a token
// stream's allocations; sure is false when the document is not such a
// one, and walk must decide (a syntax error, whose report walk leaves to
// encoding/json, and anything unusual).
func fastCheck(b []byte, free string) (err error, sure bool) {
	s := scanner{b: b, free: free}
	s.space()
	if s.i >= len(b) || b[s.i] != '{' {
		return nil, false
	}
	err = s.value(false, 0)
	if err == errUnsure {
		return nil, false
	}
	if err == nil {
		if s.space(); s.i != len(b) {
			return nil, false
		}
	}
	return err, true
}

// errUnsure stops the scan: walk decides.
var errUnsure = errors.New("strictjson: not for the fast check")

type scanner struct {
	b    []byte
	i    int
	free string
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next is the byte at the scan, or 0 at the end.
func (s *scanner) next() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// value scans one value as walk reads it (isFree and depth as there).
func (s *scanner) value(isFree bool, depth int) error {
	switch c := s.next(); c {
	case '{', '[':
		if depth >= maxDepth {
			return fmt.Errorf("arrays and objects nested more than %d deep", maxDepth)
		}
		s.i++
		s.space()
		if c == '[' {
			return s.array(depth)
		}
		return s.object(isFree, depth)
	case '"':
		_, err := s.str(false)
		return err
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		return s.number()
	}
}

func (s *scanner) array(depth int) error {
	if s.next() == ']' {
		s.i++
		return nil
	}
	for {
		if err := s.value(false, depth+1); err != nil {
			return err
		}
		s.space()
		switch s.next() {
		case ',':
			s.i++
			s.space()
		case ']':
			s.i++
			return nil
		default:
			return errUnsure
		}
	}
}

func (s *scanner) object(isFree bool, depth int) error {
	if s.next() == '}' {
		s.i++
		return nil
	}
	var few [8][]byte
	names := few[:0]
	var seen map[string]bool
	for {
		if s.next() != '"' {
			return errUnsure
		}
		name, err := s.str(true)
		if err != nil {
			return err
		}
		dup := false
		if seen != nil {
			dup = seen[string(name)]
		} else {
			for _, n := range names {
				dup = dup || string(n) == string(name)
			}
		}
		if dup {
			return errors.New("field " + quote(string(name)) + " given twice")
		}
		if seen == nil && len(names) < len(few) {
			names = append(names, name)
		} else {
			if seen == nil {
				seen = make(map[string]bool, 2*len(few))
				for _, n := range names {
					seen[string(n)] = true
				}
			}
			seen[string(name)] = true
		}
		if !isFree && !plainName(name) {
			return errors.New("unknown field " + quote(string(name)) + " (field names are in lower case)")
		}
		s.space()
		if s.next() != ':' {
			return errUnsure
		}
		s.i++
		s.space()
		if err := s.value(!isFree && s.free != "" && string(name) == s.free, depth+1); err != nil {
			return err
		}
		s.space()
		switch s.next() {
		case ',':
			s.i++
			s.space()
		case '}':
			s.i++
			return nil
		default:
			return errUnsure
		}
	}
}

// str scans a string at the scan (its opening quote); as a name it
// returns its bytes (in s.b), and a name with an escape is not for the
// fast check.
func (s *scanner) str(name bool) ([]byte, error) {
	start := s.i + 1
	for s.i = start; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			if name {
				return s.b[start : s.i-1], nil
			}
			return nil, nil
		case c < 0x20:
			return nil, errUnsure
		case c == '\\':
			if name || s.i+1 >= len(s.b) {
				return nil, errUnsure
			}
			s.i++
			switch s.b[s.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if _, ok := hex4(s.b, s.i+1); !ok {
					return nil, errUnsure
				}
				s.i += 4
			default:
				return nil, errUnsure
			}
		}
	}
	return nil, errUnsure
}

func (s *scanner) literal(lit string) error {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return errUnsure
	}
	s.i += len(lit)
	return nil
}

// number scans a number as JSON writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() error {
	if s.next() == '-' {
		s.i++
	}
	switch c := s.next(); {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		s.digits()
	default:
		return errUnsure
	}
	if s.next() == '.' {
		s.i++
		if !s.digits() {
			return errUnsure
		}
	}
	if c := s.next(); c == 'e' || c == 'E' {
		s.i++
		if c := s.next(); c == '+' || c == '-' {
			s.i++
		}
		if !s.digits() {
			return errUnsure
		}
	}
	return nil
}

// digits scans [0-9]* and reports whether there was one.
func (s *scanner) digits() bool {
	start := s.i
	for c := s.next(); c >= '0' && c <= '9'; c = s.next() {
		s.i++
	}
	return s.i > start
}
