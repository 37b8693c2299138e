package sfv

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Item is a parsed structured field item: a bare value (int64, float64,
// string, Token, []byte or bool) with its parameters, in order. An inner
// list has Inner set and a nil Value.
type Item struct {
	Value  any
	Inner  []Item
	Params []Param
}

// Param is one parameter of an item.
type Param struct {
	Key   string
	Value any
}

// Token is an sf-token.
type Token string

// ParseList parses a List field value strictly (RFC 8941, section 4.2.1):
// anything the grammar does not allow is an error.
func ParseList(s string) ([]Item, error) {
	p := &parser{s: s}
	p.sp()
	var list []Item
	for !p.end() {
		it, err := p.member()
		if err != nil {
			return nil, err
		}
		list = append(list, it)
		p.ows()
		if p.end() {
			return list, nil
		}
		if p.s[p.i] != ',' {
			return nil, p.errorf("want ',' between list members")
		}
		p.i++
		p.ows()
		if p.end() {
			return nil, p.errorf("a list ends with ','")
		}
	}
	return list, nil
}

// ParseItem parses an Item field value strictly (RFC 8941, section 4.2).
func ParseItem(s string) (Item, error) {
	p := &parser{s: s}
	p.sp()
	it, err := p.item()
	if err != nil {
		return Item{}, err
	}
	p.sp()
	if !p.end() {
		return Item{}, p.errorf("trailing characters")
	}
	return it, nil
}

// Unescape recovers a name that String wrote as the value of an sf-string.
func Unescape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", errors.New("a % without two hex digits")
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil || strings.ToLower(s[i+1:i+3]) != s[i+1:i+3] {
			return "", fmt.Errorf("bad escape %q", s[i:i+3])
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

type parser struct {
	s string
	i int
}

func (p *parser) end() bool { return p.i >= len(p.s) }

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("structured field %q at %d: %s", p.s, p.i, fmt.Sprintf(format, args...))
}

func (p *parser) sp() {
	for !p.end() && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *parser) ows() {
	for !p.end() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *parser) member() (Item, error) {
	if !p.end() && p.s[p.i] == '(' {
		return p.innerList()
	}
	return p.item()
}

func (p *parser) innerList() (Item, error) {
	p.i++ // (
	var it Item
	for {
		p.sp()
		if p.end() {
			return Item{}, p.errorf("an inner list without ')'")
		}
		if p.s[p.i] == ')' {
			p.i++
			params, err := p.params()
			it.Params = params
			return it, err
		}
		m, err := p.item()
		if err != nil {
			return Item{}, err
		}
		it.Inner = append(it.Inner, m)
		if !p.end() && p.s[p.i] != ' ' && p.s[p.i] != ')' {
			return Item{}, p.errorf("want ' ' or ')' in an inner list")
		}
	}
}

func (p *parser) item() (Item, error) {
	v, err := p.bare()
	if err != nil {
		return Item{}, err
	}
	params, err := p.params()
	return Item{Value: v, Params: params}, err
}

func (p *parser) params() ([]Param, error) {
	var ps []Param
	for !p.end() && p.s[p.i] == ';' {
		p.i++
		p.sp()
		k, err := p.key()
		if err != nil {
			return nil, err
		}
		var v any = true
		if !p.end() && p.s[p.i] == '=' {
			p.i++
			if v, err = p.bare(); err != nil {
				return nil, err
			}
		}
		ps = append(ps, Param{k, v})
	}
	return ps, nil
}

func lcalpha(c byte) bool { return c >= 'a' && c <= 'z' }
func digit(c byte) bool   { return c >= '0' && c <= '9' }
func alpha(c byte) bool   { return lcalpha(c) || (c >= 'A' && c <= 'Z') }

func (p *parser) key() (string, error) {
	if p.end() || !(lcalpha(p.s[p.i]) || p.s[p.i] == '*') {
		return "", p.errorf("a key starts with a lowercase letter or '*'")
	}
	start := p.i
	for !p.end() {
		c := p.s[p.i]
		if !(lcalpha(c) || digit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *parser) bare() (any, error) {
	if p.end() {
		return nil, p.errorf("missing value")
	}
	switch c := p.s[p.i]; {
	case c == '-' || digit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || alpha(c):
		return p.token(), nil
	case c == ':':
		return p.bytes()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, p.errorf("a boolean is ?0 or ?1")
	}
	return nil, p.errorf("unexpected %q", p.s[p.i])
}

func (p *parser) number() (any, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	if p.end() || !digit(p.s[p.i]) {
		return nil, p.errorf("a number needs a digit")
	}
	intDigits, fracDigits, dot := 0, 0, false
	for !p.end() {
		c := p.s[p.i]
		switch {
		case digit(c) && !dot:
			intDigits++
		case digit(c):
			fracDigits++
		case c == '.' && !dot:
			if intDigits > 12 {
				return nil, p.errorf("a decimal has at most 12 integer digits")
			}
			dot = true
		default:
			goto done
		}
		p.i++
	}
done:
	text := p.s[start:p.i]
	if !dot {
		if intDigits > 15 {
			return nil, p.errorf("an integer has at most 15 digits")
		}
		return strconv.ParseInt(text, 10, 64)
	}
	if fracDigits == 0 || fracDigits > 3 {
		return nil, p.errorf("a decimal has 1 to 3 fractional digits, not %d", fracDigits)
	}
	return strconv.ParseFloat(text, 64)
}

func (p *parser) str() (any, error) {
	p.i++ // "
	var b strings.Builder
	for !p.end() {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.end() || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return nil, p.errorf("a backslash escapes only '\"' and '\\\\'")
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return nil, p.errorf("byte %#x in a string (printable ASCII only)", c)
		default:
			b.WriteByte(c)
		}
	}
	return nil, p.errorf("a string without its closing quote")
}

func (p *parser) token() Token {
	start := p.i
	p.i++
	for !p.end() {
		c := p.s[p.i]
		if !(alpha(c) || digit(c) || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0) {
			break
		}
		p.i++
	}
	return Token(p.s[start:p.i])
}

func (p *parser) bytes() (any, error) {
	p.i++ // :
	end := strings.IndexByte(p.s[p.i:], ':')
	if end < 0 {
		return nil, p.errorf("a byte sequence without its closing ':'")
	}
	b, err := base64.StdEncoding.Strict().DecodeString(p.s[p.i : p.i+end])
	if err != nil {
		return nil, p.errorf("byte sequence: %v", err)
	}
	p.i += end + 1
	return b, nil
}

// Quota units of the RateLimit-Policy "qu" parameter, as the IETF httpapi
// ratelimit-headers draft defines them ("requests" is the default, when
// there is no "qu").
const (
	UnitRequests           = "requests"
	UnitContentBytes       = "content-bytes"
	UnitConcurrentRequests = "concurrent-requests"
)

// CheckHeaders parses strictly every RateLimit header drip writes, as
// get (http.Header.Get, or a lookup in Envoy's headers) returns them, and
// holds them to the IETF httpapi ratelimit-headers draft and to drip's
// use of it:
//
//   - RateLimit-Policy is a list of items whose value is a string, each
//     with q (a non-negative integer), and optionally qu (one of the
//     draft's quota units) and w (a positive integer); a quota of
//     concurrent requests has no window w.
//   - RateLimit is a list of items whose value is a string, each with r
//     (a non-negative integer) and optionally t (a non-negative integer).
//   - RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset and
//     Retry-After are single non-negative integers.
//
// No other parameter is allowed. Absent headers are skipped. It returns
// every problem found.
func CheckHeaders(get func(name string) string) error {
	var errs []error
	bad := func(name string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
	}
	// params: of each list, which parameters may appear (true: must).
	params := map[string]map[string]bool{
		"RateLimit-Policy": {"q": true, "qu": false, "w": false},
		"RateLimit":        {"r": true, "t": false},
	}
	for _, name := range []string{"RateLimit-Policy", "RateLimit"} {
		v := get(name)
		if v == "" {
			continue
		}
		list, err := ParseList(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		for i, it := range list {
			if _, ok := it.Value.(string); !ok {
				bad(name, "member %d is %T, want a string", i, it.Value)
			}
			seen := map[string]any{}
			for _, p := range it.Params {
				if _, ok := params[name][p.Key]; !ok {
					bad(name, "member %d has parameter %q", i, p.Key)
					continue
				}
				if _, dup := seen[p.Key]; dup {
					bad(name, "member %d has %q twice", i, p.Key)
				}
				seen[p.Key] = p.Value
				switch p.Key {
				case "qu":
					if u, _ := p.Value.(string); u != UnitRequests && u != UnitContentBytes && u != UnitConcurrentRequests {
						bad(name, "member %d: qu=%v is not a quota unit", i, p.Value)
					}
				case "w":
					if n, ok := p.Value.(int64); !ok || n <= 0 {
						bad(name, "member %d: w=%v is not a positive integer", i, p.Value)
					}
				default:
					if n, ok := p.Value.(int64); !ok || n < 0 {
						bad(name, "member %d: %s=%v is not a non-negative integer", i, p.Key, p.Value)
					}
				}
			}
			for k, must := range params[name] {
				if _, ok := seen[k]; must && !ok {
					bad(name, "member %d has no %q", i, k)
				}
			}
			if _, w := seen["w"]; w && seen["qu"] == UnitConcurrentRequests {
				bad(name, "member %d: a quota of concurrent requests has a window", i)
			}
		}
	}
	for _, name := range []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "Retry-After"} {
		v := get(name)
		if v == "" {
			continue
		}
		it, err := ParseItem(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		if n, ok := it.Value.(int64); !ok || n < 0 || len(it.Params) > 0 {
			bad(name, "%q is not a non-negative integer", v)
		}
	}
	return errors.Join(errs...)
}
