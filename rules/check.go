package rules

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/nearest"
	"github.com/driplimit/drip/internal/seconds"
)

// checker turns plain values into a Set, collecting every problem.
type checker struct {
	file     string
	env      *Env // nil: name the jwt secret and key files, read none
	problems []Issue
	jwtUser  string // the first rule that reads jwt: claims
	keyUser  string // the first limit key that is hashed
}

func (c *checker) add(path, format string, args ...any) {
	c.problems = append(c.problems, Issue{Path: path, Message: fmt.Sprintf(format, args...)})
}

// fields reads the fields of one object and reports those never read.
type fields struct {
	c    *checker
	path string
	o    *object
	used map[string]bool
}

func (c *checker) object(path string, v any) (*fields, bool) {
	o, ok := v.(*object)
	if !ok {
		c.add(path, "must be an object, not %s", kindOf(v))
		return nil, false
	}
	return &fields{c: c, path: path, o: o, used: map[string]bool{}}, true
}

// get returns the value of field k, if present.
func (f *fields) get(k string) (any, string, bool) {
	f.used[k] = true
	v, ok := f.o.vals[k]
	return v, field(f.path, k), ok
}

func (f *fields) has(k string) bool { _, ok := f.o.vals[k]; return ok }

// done reports the fields that are not in known, with a suggestion when
// one is close to a known name.
func (f *fields) done(known ...string) {
	for _, k := range f.o.keys {
		if f.used[k] {
			continue
		}
		msg := "unknown field"
		if s := suggest(k, known); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		f.c.add(field(f.path, k), "%s", msg)
	}
}

func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case *object:
		return "an object"
	case []any:
		return "a list"
	case string:
		return "a string"
	case json.Number, float64:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}

func (c *checker) str(path string, v any) (string, bool) {
	s, ok := v.(string)
	if !ok {
		c.add(path, "must be a string, not %s", kindOf(v))
	}
	return s, ok
}

func (c *checker) boolean(path string, v any) (b, ok bool) {
	b, ok = v.(bool)
	if !ok {
		c.add(path, "must be true or false, not %s", kindOf(v))
	}
	return b, ok
}

func (c *checker) num(path string, v any) (float64, bool) {
	switch x := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil || math.IsInf(f, 0) {
			c.add(path, "must be a finite number")
			return 0, false
		}
		return f, true
	case float64:
		c.add(path, "must be a finite number")
		return 0, false
	}
	c.add(path, "must be a number, not %s", kindOf(v))
	return 0, false
}

// amount reads a positive amount of tokens, as drip.Limit accepts.
func (c *checker) amount(path string, v any) (float64, bool) {
	f, ok := c.num(path, v)
	if !ok {
		return 0, false
	}
	switch {
	case f <= 0:
		c.add(path, "must be > 0")
	case f > 1e12:
		c.add(path, "must be at most 1e12")
	case math.Round(f*bucket.Micro) == 0:
		c.add(path, "must be at least 0.000001")
	default:
		return f, true
	}
	return 0, false
}

func (c *checker) integer(path string, v any, lo, hi int) (int, bool) {
	f, ok := c.num(path, v)
	if !ok {
		return 0, false
	}
	if f != math.Trunc(f) || f < float64(lo) || f > float64(hi) {
		c.add(path, "must be a whole number from %d to %d", lo, hi)
		return 0, false
	}
	return int(f), true
}

func (c *checker) duration(path string, v any, zeroOK bool) (time.Duration, bool) {
	d, err := seconds.Parse(v)
	if err != nil {
		c.add(path, "must be a duration (\"10s\") or a number of seconds")
		return 0, false
	}
	if d < 0 || (d == 0 && !zeroOK) {
		if zeroOK {
			c.add(path, "must be >= 0")
		} else {
			c.add(path, "must be > 0")
		}
		return 0, false
	}
	return d, true
}

func (c *checker) list(path string, v any) ([]any, bool) {
	l, ok := v.([]any)
	if !ok {
		c.add(path, "must be a list, not %s", kindOf(v))
	}
	return l, ok
}

func (c *checker) enum(path string, v any, allowed ...string) (string, bool) {
	s, ok := c.str(path, v)
	if !ok {
		return "", false
	}
	for _, a := range allowed {
		if s == a {
			return s, true
		}
	}
	q := make([]string, len(allowed))
	for i, a := range allowed {
		q[i] = strconv.Quote(a)
	}
	alts := strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
	c.add(path, "must be %s, not %q", alts, s)
	return "", false
}

// suggest returns the name in known closest to k, if it is close.
func suggest(k string, known []string) string {
	best, d := nearest.Name(k, known)
	if d < 0 || d > 2 {
		return ""
	}
	return best
}
