// Package llm reads what model servers' APIs say of a call's tokens, as
// OpenAI's and Anthropic's APIs (and the servers compatible with them:
// vLLM, Ollama's /v1, llama.cpp's server) send it: the usage a response
// reports (Usage, read by a Scanner as the response's bytes go by), and
// the most a request can cost (Bound, from its JSON body).
//
// Nothing here buffers a response: a Scanner is a state machine of a few
// hundred bytes that reads each byte once, whatever the body's length.
package llm

// The JSON tokenizer under Scanner and Bound: it reads a JSON text one
// byte at a time and reports each scalar value (number, string, literal)
// with the object keys of its path. It keeps the keys of the first
// maxDepth levels and the first maxCapture bytes of each scalar; longer
// keys and values are cut (and marked so), deeper levels only counted.
// Strings inside values are skipped, never kept.

const (
	maxDepth   = 6  // levels whose key is kept
	maxKey     = 32 // bytes of a key kept
	maxCapture = 96 // bytes of a scalar kept (a model's name)
)

// Kinds of a scalar value.
const (
	kNumber = iota + 1
	kString
	kLiteral // true, false, null
)

// Tokenizer states.
const (
	sValue     = iota // expecting a value
	sKeyOrEnd         // in an object: a key or '}'
	sKey              // in an object after ',': a key
	sKeyString        // reading a key
	sKeyEscape        // after '\' in a key
	sColon            // after a key
	sString           // reading a string value
	sEscape           // after '\' in a string value
	sScalar           // reading a number or literal
	sAfter            // after a value: ',' or the container's end
	sDone             // the top-level value ended
	sBad              // not JSON: the rest is ignored
)

type level struct {
	object bool
	key    [maxKey]byte
	keyLen uint8
	keyCut bool
}

// tokenizer is the JSON state machine. Its zero value expects a value.
type tokenizer struct {
	state    uint8
	depth    int // open containers
	levels   [maxDepth]level
	capture  [maxCapture]byte
	capLen   uint8
	capCut   bool
	capKind  uint8
	emptyArr bool // just after '[': ']' may close it
	// scalar is called with each scalar value when it ends; open, when
	// set, when an object or array opens (depth counts it).
	scalar func(t *tokenizer, kind uint8, v []byte, cut bool)
	open   func(t *tokenizer)
}

func (t *tokenizer) reset() {
	t.state, t.depth, t.capLen, t.capCut, t.emptyArr = sValue, 0, 0, false, false
}

// key is the key of the value at level i (0 is the top), empty when it
// is not kept. It is valid until the next write.
func (t *tokenizer) key(i int) []byte {
	if i >= t.depth || i >= maxDepth {
		return nil
	}
	l := &t.levels[i]
	if !l.object || l.keyCut {
		return nil
	}
	return l.key[:l.keyLen]
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (t *tokenizer) push(object bool) {
	if t.depth < maxDepth {
		l := &t.levels[t.depth]
		l.object, l.keyLen, l.keyCut = object, 0, false
	}
	t.depth++
	if t.open != nil {
		t.open(t)
	}
}

func (t *tokenizer) pop(object bool) {
	if t.depth == 0 || (t.depth <= maxDepth && t.levels[t.depth-1].object != object) {
		t.state = sBad
		return
	}
	t.depth--
	t.after()
}

func (t *tokenizer) after() {
	if t.depth == 0 {
		t.state = sDone
	} else {
		t.state = sAfter
	}
}

func (t *tokenizer) keep(c byte) {
	if t.capLen < maxCapture {
		t.capture[t.capLen] = c
		t.capLen++
	} else {
		t.capCut = true
	}
}

func (t *tokenizer) keyByte(c byte) {
	if t.depth > maxDepth {
		return
	}
	l := &t.levels[t.depth-1]
	if l.keyLen < maxKey {
		l.key[l.keyLen] = c
		l.keyLen++
	} else {
		l.keyCut = true
	}
}

func (t *tokenizer) startScalar(kind uint8) {
	t.capKind, t.capLen, t.capCut = kind, 0, false
}

func (t *tokenizer) endScalar() {
	if t.scalar != nil {
		t.scalar(t, t.capKind, t.capture[:t.capLen], t.capCut)
	}
	t.after()
}

// write reads p.
func (t *tokenizer) write(p []byte) {
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch t.state {
		case sValue:
			switch {
			case isSpace(c):
			case c == '{':
				t.push(true)
				t.state = sKeyOrEnd
			case c == '[':
				t.push(false)
				t.emptyArr = true
				continue
			case c == ']' && t.emptyArr:
				t.pop(false)
			case c == '"':
				t.startScalar(kString)
				t.state = sString
			case c == '-' || ('0' <= c && c <= '9'):
				t.startScalar(kNumber)
				t.keep(c)
				t.state = sScalar
			case c == 't' || c == 'f' || c == 'n':
				t.startScalar(kLiteral)
				t.keep(c)
				t.state = sScalar
			default:
				t.state = sBad
			}
		case sKeyOrEnd, sKey:
			switch {
			case isSpace(c):
			case c == '"':
				if t.depth <= maxDepth {
					l := &t.levels[t.depth-1]
					l.keyLen, l.keyCut = 0, false
				}
				t.state = sKeyString
			case c == '}' && t.state == sKeyOrEnd:
				t.pop(true)
			default:
				t.state = sBad
			}
		case sKeyString:
			switch c {
			case '"':
				t.state = sColon
			case '\\':
				t.keyByte(c)
				t.state = sKeyEscape
			default:
				t.keyByte(c)
			}
		case sKeyEscape:
			t.keyByte(c)
			t.state = sKeyString
		case sColon:
			switch {
			case isSpace(c):
			case c == ':':
				t.state = sValue
			default:
				t.state = sBad
			}
		case sString:
			switch c {
			case '"':
				t.endScalar()
			case '\\':
				t.keep(c)
				t.state = sEscape
			default:
				t.keep(c)
			}
		case sEscape:
			t.keep(c)
			t.state = sString
		case sScalar:
			if c == ',' || c == '}' || c == ']' || isSpace(c) {
				t.endScalar()
				i-- // the delimiter is read after the value
				continue
			}
			t.keep(c)
		case sAfter:
			switch {
			case isSpace(c):
			case c == ',':
				if t.depth <= maxDepth && !t.levels[t.depth-1].object {
					t.state = sValue
				} else if t.depth > maxDepth {
					// Too deep to know: a key or a value may follow.
					// Both begin with a quote or a value byte; read it
					// as a value (deep values are never reported).
					t.state = sValue
				} else {
					t.state = sKey
				}
			case c == '}':
				t.pop(true)
			case c == ']':
				t.pop(false)
			default:
				t.state = sBad
			}
		case sDone:
			if !isSpace(c) {
				t.state = sBad
			}
		case sBad:
			return
		}
		t.emptyArr = false
	}
}

// end ends the text: a top-level scalar still open is reported.
func (t *tokenizer) end() {
	if t.state == sScalar {
		t.endScalar()
	}
}

// count reads a scalar as a count of tokens: a JSON number, or a string
// holding one (servers that read JSON leniently take "512" for 512), at
// least 0, rounded up, and at most MaxCount; ok is false for anything
// else (null, true, text).
func count(kind uint8, v []byte, cut bool) (n int64, ok bool) {
	if kind == kString {
		if cut {
			return saturate(v)
		}
		return parseCount(v)
	}
	if kind != kNumber {
		return 0, false
	}
	if cut {
		return saturate(v)
	}
	return parseCount(v)
}

// saturate reads a number too long to keep: a huge one (MaxCount) when
// what was kept is digits, else not a count.
func saturate(v []byte) (int64, bool) {
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	return MaxCount, len(v) > 0
}

// MaxCount is the largest count of tokens read: larger ones read as it.
const MaxCount = 1_000_000_000_000

// parseCount reads a JSON number (sign, digits, fraction, exponent),
// rounded up, clamped to [0, MaxCount].
func parseCount(v []byte) (int64, bool) {
	i := 0
	neg := false
	if i < len(v) && v[i] == '-' {
		neg, i = true, i+1
	}
	var m int64 // the digits read, as an integer
	scale := 0  // the value is m * 10^scale
	digits := 0
	for ; i < len(v) && '0' <= v[i] && v[i] <= '9'; i++ {
		digits++
		if m < MaxCount {
			m = m*10 + int64(v[i]-'0')
		} else {
			scale++
		}
	}
	if digits == 0 {
		return 0, false
	}
	if i < len(v) && v[i] == '.' {
		i++
		fd := 0
		for ; i < len(v) && '0' <= v[i] && v[i] <= '9'; i++ {
			fd++
			if m < MaxCount {
				m = m*10 + int64(v[i]-'0')
				scale--
			}
		}
		if fd == 0 {
			return 0, false
		}
	}
	if i < len(v) && (v[i] == 'e' || v[i] == 'E') {
		i++
		sign := 1
		if i < len(v) && (v[i] == '+' || v[i] == '-') {
			if v[i] == '-' {
				sign = -1
			}
			i++
		}
		e, ed := 0, 0
		for ; i < len(v) && '0' <= v[i] && v[i] <= '9'; i++ {
			ed++
			if e < 1000 {
				e = e*10 + int(v[i]-'0')
			}
		}
		if ed == 0 {
			return 0, false
		}
		scale += sign * e
	}
	if i != len(v) {
		return 0, false
	}
	if neg || m == 0 {
		return 0, true
	}
	up := false // digits dropped below the units: round up
	for ; scale < 0 && m > 0; scale++ {
		up = up || m%10 != 0
		m /= 10
	}
	if scale < 0 { // all digits were below the units
		return 1, true
	}
	for ; scale > 0 && m < MaxCount; scale-- {
		m *= 10
	}
	if up {
		m++
	}
	return min(m, MaxCount), true
}
