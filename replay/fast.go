package replay

import (
	"strconv"

	"github.com/driplimit/drip"
)

// decodeFast reads the common request without encoding/json: one object
// of key, cost, reserve, lease and an inline limit of rate and burst, with
// no escape in a string, no null and nothing after it. ok is false for
// anything else, and for anything the full path would refuse (a burst not
// over 0, a number out of range): decodeJSON decides those, so that both
// paths give one reading and one error. Decode runs strictjson.Check first.
func decodeFast(b []byte) (r Raw, ok bool) {
	p := fastParser{b: b}
	if !p.byte('{') {
		return Raw{}, false
	}
	var seen uint8
	for {
		name, ok := p.str()
		if !ok || !p.byte(':') {
			return Raw{}, false
		}
		var bit uint8
		var v []byte
		switch string(name) {
		case "key":
			bit = 1
			v, ok = p.str()
			r.Key = string(v)
		case "lease":
			bit = 2
			v, ok = p.str()
			r.Lease = string(v)
		case "reserve":
			bit = 4
			r.Reserve, ok = p.boolean()
		case "cost":
			bit = 8
			var c float64
			c, ok = p.number()
			r.Cost = &c
		case "limit":
			bit = 16
			var l drip.Limit
			l, ok = p.limit()
			r.Limit = &l
		default:
			return Raw{}, false
		}
		if !ok || seen&bit != 0 {
			return Raw{}, false
		}
		seen |= bit
		if p.byte('}') {
			break
		}
		if !p.byte(',') {
			return Raw{}, false
		}
	}
	if p.space(); p.i != len(b) {
		return Raw{}, false
	}
	r.Op = "take"
	return r, true
}

// fastParser reads the bytes of decodeFast; each method skips the space
// before what it reads.
type fastParser struct {
	b []byte
	i int
}

func (p *fastParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// byte reads c, if it is next.
func (p *fastParser) byte(c byte) bool {
	if p.space(); p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// str reads a string with no escape and no control character: its bytes,
// in p.b.
func (p *fastParser) str() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	for j := p.i; j < len(p.b); j++ {
		switch c := p.b[j]; {
		case c == '"':
			s := p.b[p.i:j]
			p.i = j + 1
			return s, true
		case c == '\\' || c < 0x20:
			return nil, false
		}
	}
	return nil, false
}

func (p *fastParser) boolean() (bool, bool) {
	p.space()
	for _, lit := range []string{"false", "true"} {
		if len(p.b)-p.i >= len(lit) && string(p.b[p.i:p.i+len(lit)]) == lit {
			p.i += len(lit)
			return lit == "true", true
		}
	}
	return false, false
}

// number reads a number as JSON writes it,
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, into a float64 as
// encoding/json does (strconv.ParseFloat; out of range is not ok).
func (p *fastParser) number() (float64, bool) {
	p.space()
	start := p.i
	if p.next() == '-' {
		p.i++
	}
	switch c := p.next(); {
	case c == '0':
		p.i++
	case c >= '1' && c <= '9':
		p.digits()
	default:
		return 0, false
	}
	if p.next() == '.' {
		p.i++
		if !p.digits() {
			return 0, false
		}
	}
	if c := p.next(); c == 'e' || c == 'E' {
		p.i++
		if c := p.next(); c == '+' || c == '-' {
			p.i++
		}
		if !p.digits() {
			return 0, false
		}
	}
	f, err := strconv.ParseFloat(string(p.b[start:p.i]), 64)
	return f, err == nil
}

func (p *fastParser) next() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *fastParser) digits() bool {
	start := p.i
	for c := p.next(); c >= '0' && c <= '9'; c = p.next() {
		p.i++
	}
	return p.i > start
}

// limit reads {"rate": r, "burst": b} (either, in any order) as
// drip.Limit's UnmarshalJSON would; a burst not over 0, which it refuses,
// is not ok.
func (p *fastParser) limit() (drip.Limit, bool) {
	var l drip.Limit
	if !p.byte('{') || p.byte('}') {
		return l, false
	}
	var seen uint8
	for {
		name, ok := p.str()
		if !ok || !p.byte(':') {
			return l, false
		}
		var bit uint8
		switch string(name) {
		case "rate":
			bit = 1
			l.Rate, ok = p.number()
		case "burst":
			bit = 2
			l.Burst, ok = p.number()
			ok = ok && l.Burst > 0
		default:
			return l, false
		}
		if !ok || seen&bit != 0 {
			return l, false
		}
		seen |= bit
		if p.byte('}') {
			return l, true
		}
		if !p.byte(',') {
			return l, false
		}
	}
}
