package rules

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/textproto"
	"strings"

	"github.com/driplimit/drip/internal/llm"
	"github.com/driplimit/drip/store"
)

// Kind is where a key, match or cost value is read from.
type Kind string

const (
	KindIP     Kind = "ip"     // ip:address, the client IP (see Set.TrustedProxies)
	KindHeader Kind = "header" // header:<name>, the first value of a request header
	KindQuery  Kind = "query"  // query:<name>, the first value of a query parameter
	KindJWT    Kind = "jwt"    // jwt:<claim>, a claim of a verified bearer token
	KindPath   Kind = "path"   // path, the cleaned URL path
	KindMethod Kind = "method" // method, the HTTP method
	KindCookie Kind = "cookie" // cookie:<name>, a cookie's value
	KindGlobal Kind = "global" // global, one bucket for every request
	// KindAPIKey is api_key, the API key a client of a model server's
	// API sends: the token of "Authorization: Bearer", else the
	// x-api-key header. A limit key only, and only hashed (hash:api_key).
	KindAPIKey Kind = "api_key"
	KindFixed  Kind = "fixed" // fixed, a cost_source only: the rule's fixed_cost
	// KindBound is a cost_source only: the most a model server's call
	// can cost, read from its JSON body as the API in Name ("openai" or
	// "anthropic") says (its prompt's size, its output maximum).
	KindBound Kind = "bound"
	// KindFunc is a value a program computes (a key or a cost function,
	// FuncRule); it is never written in a rules file.
	KindFunc Kind = "func"
)

// Source names one value of a request, as written in a rules file:
// "header:x-api-key", "jwt:plan", "path". Name is the part after the
// colon; for headers it is in canonical form (X-Api-Key).
//
// Hashed ("hash:header:x-api-key") keys the bucket by the value's keyed
// hash: HMAC-SHA-256 under the file's key_secret_env. An API key used as
// a limit key is then never stored, logged or shown in clear.
type Source struct {
	Kind   Kind
	Name   string
	Hashed bool
	// Prices is the file's price table, for a bound that is a price
	// ("openai:money").
	Prices *llm.Prices
}

// String returns the source as written in a rules file (headers in lower
// case).
func (s Source) String() string {
	if s.Hashed {
		t := s
		t.Hashed = false
		return "hash:" + t.String()
	}
	switch s.Kind {
	case KindIP:
		return "ip:address"
	case KindPath, KindMethod, KindGlobal, KindFixed, KindFunc, KindAPIKey:
		return string(s.Kind)
	case KindHeader:
		return "header:" + strings.ToLower(s.Name)
	case KindBound:
		return s.Name
	}
	return string(s.Kind) + ":" + s.Name
}

const sourceList = "ip:address, header:<name>, query:<name>, jwt:<claim>, path, method, cookie:<name>, global"

// ParseSource reads a source as written in a rules file.
func ParseSource(s string) (Source, error) {
	kind, name, colon := strings.Cut(s, ":")
	bad := fmt.Errorf("%q is not a key source (%s)", s, sourceList)
	switch Kind(kind) {
	case KindPath, KindMethod, KindGlobal, KindAPIKey:
		if colon {
			return Source{}, bad
		}
		return Source{Kind: Kind(kind)}, nil
	case KindIP:
		if name != "address" {
			return Source{}, fmt.Errorf("%q is not a key source: the client IP is ip:address", s)
		}
		return Source{Kind: KindIP}, nil
	case KindHeader:
		if !isToken(name) {
			return Source{}, fmt.Errorf("%q: %q is not a valid header name", s, name)
		}
		return Source{Kind: KindHeader, Name: textproto.CanonicalMIMEHeaderKey(name)}, nil
	case KindCookie:
		if !isToken(name) {
			return Source{}, fmt.Errorf("%q: %q is not a valid cookie name", s, name)
		}
		return Source{Kind: KindCookie, Name: name}, nil
	case KindQuery, KindJWT:
		if name == "" || strings.TrimSpace(name) != name {
			return Source{}, fmt.Errorf("%q: the %s name is empty or has surrounding spaces", s, kind)
		}
		return Source{Kind: Kind(kind), Name: name}, nil
	}
	return Source{}, bad
}

// isToken reports whether s is an RFC 9110 token (a header or cookie name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// maxValueLen is the longest key value kept as is; longer values are
// replaced by their SHA-256, so that a huge header cannot make a huge key.
const maxValueLen = 128

// Key returns the rule's bucket key for the values of its LimitKeys, in
// order: the rule name and the values, separated by '|'. Each value is
// escaped ('\' becomes `\\`, '|' becomes `\|`), so no value forges
// another key. A value over 128 bytes becomes `\h` and its hex SHA-256.
// A "global" key adds no value. A key still over store.MaxKeyLen becomes
// store.FitKey's stand-in. Every front door builds keys here, so they
// share buckets. Keys depend only on the rule name, so state survives a
// reload.
func (r *Rule) Key(values []string) string {
	var b strings.Builder
	b.Grow(len(r.Name) + 16*len(values))
	b.WriteString(r.Name)
	vi := 0
	for _, src := range r.LimitKeys {
		if src.Kind == KindGlobal {
			continue
		}
		v := ""
		if vi < len(values) {
			v = values[vi]
		}
		vi++
		b.WriteByte('|')
		writeEscaped(&b, v)
	}
	return store.FitKey(b.String())
}

func writeEscaped(b *strings.Builder, v string) {
	if len(v) > maxValueLen {
		sum := sha256.Sum256([]byte(v))
		b.WriteString(`\h`)
		b.WriteString(hex.EncodeToString(sum[:]))
		return
	}
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\', '|':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
}

// KeySources returns the rule's limit keys that take a value (all but
// "global"), in the order Key expects their values.
func (r *Rule) KeySources() []Source {
	out := make([]Source, 0, len(r.LimitKeys))
	for _, s := range r.LimitKeys {
		if s.Kind != KindGlobal {
			out = append(out, s)
		}
	}
	return out
}

// KeyFrom builds the rule's bucket key from values named by source, as
// written in a rules file ({"header:x-api-key": "k1"}); header names are
// case-insensitive. Every limit key needs a non-empty value.
//
// A hashed limit key ("hash:api_key") takes the value in clear and keys
// by its hash, as requests are keyed.
func (r *Rule) KeyFrom(values map[string]string) (string, error) {
	byName := make(map[Source]string, len(values))
	for k, v := range values {
		s, err := parseKeySource(k)
		if err != nil {
			return "", err
		}
		if s.Hashed {
			v = r.HashValue(v)
		}
		byName[s] = v
	}
	srcs := r.KeySources()
	vals := make([]string, len(srcs))
	var missing []string
	for i, s := range srcs {
		v, ok := byName[s]
		if !ok || v == "" {
			missing = append(missing, s.String())
		}
		vals[i] = v
		delete(byName, s)
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("rule %q needs a value for %s", r.Name, strings.Join(missing, ", "))
	}
	for s := range byName {
		return "", fmt.Errorf("rule %q has no limit key %s", r.Name, s)
	}
	return r.Key(vals), nil
}

// Condition is one condition of a rule's match: the value of Source must
// equal one of Values, or start with one of Prefixes (written "/api/*").
// A request lacking the value does not match.
type Condition struct {
	Source   Source
	Values   []string
	Prefixes []string
}

// Matches reports whether a present value v satisfies the condition.
func (c Condition) Matches(v string) bool {
	for _, x := range c.Values {
		if v == x {
			return true
		}
	}
	for _, p := range c.Prefixes {
		if strings.HasPrefix(v, p) {
			return true
		}
	}
	return false
}

// Matches reports whether every condition of the rule holds for a request
// whose values get returns (ok false: the request has no such value).
func (r *Rule) Matches(get func(Source) (string, bool)) bool {
	for _, c := range r.Match {
		v, ok := get(c.Source)
		if !ok || !c.Matches(v) {
			return false
		}
	}
	return true
}

// KeyValues returns a request's values of the rule's limit keys (all but
// "global"), in the order Key expects. ok is false when one is missing or
// empty: the rule then does not limit the request.
func (r *Rule) KeyValues(get func(Source) (string, bool)) (values []string, ok bool) {
	values = make([]string, 0, len(r.LimitKeys))
	for _, s := range r.LimitKeys {
		if s.Kind == KindGlobal {
			continue
		}
		v, ok := get(s)
		if !ok || v == "" {
			return nil, false
		}
		if s.Hashed {
			v = r.HashValue(v)
		}
		values = append(values, v)
	}
	return values, true
}

// Values is KeyValues.
//
// Deprecated: use KeyValues. Values names what a front door offers the
// engine about a request (engine.Values).
func (r *Rule) Values(get func(Source) (string, bool)) (values []string, ok bool) {
	return r.KeyValues(get)
}

// parseKeySource reads a limit key as written in a rules file: a source,
// or "hash:" and a source.
func parseKeySource(s string) (Source, error) {
	inner, hashed := strings.CutPrefix(s, "hash:")
	src, err := ParseSource(inner)
	src.Hashed = hashed && err == nil
	return src, err
}

// HashValue returns what a hashed limit key keys by, for the value v in
// clear: "~" and the first 128 bits of its HMAC-SHA-256 under the file's
// key secret, in hex. Values given by hand (the decision and admin APIs)
// are keyed by it too.
func (r *Rule) HashValue(v string) string {
	m := hmac.New(sha256.New, r.keySecret)
	m.Write([]byte(v))
	return "~" + hex.EncodeToString(m.Sum(nil)[:16])
}

// isLLMName reports whether s names a model server's API, or a part of
// its tokens ("openai", "anthropic:output").
func isLLMName(s string) bool {
	_, _, ok := llm.ParseName(s)
	return ok
}
