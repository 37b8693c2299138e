package envoy

import (
	"strconv"
	"strings"

	"github.com/driplimit/drip/store"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// match is the limit a descriptor maps to.
type match struct {
	limit *Limit
	// shared holds, for entries matched by a share_threshold wildcard, the
	// wildcard value that keys the bucket instead of the entry's value;
	// nil when there is none.
	shared []string
}

// Match returns the limit that applies to a descriptor of domain, exactly
// as envoyproxy/ratelimit chooses it: level by level, the entry's
// "key_value" first, then a wildcard of that level (the first in file
// order whose pattern matches "key_value"; see wildcard), then the key
// alone (any value); the limit applies only if it sits at the
// descriptor's last entry. It returns nil when no limit applies (unknown
// domain, no match, or a match at another depth).
func (c *Config) Match(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry) *Limit {
	return c.match(domain, entries).limit
}

func (c *Config) match(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry) match {
	var m match
	if c == nil {
		return m
	}
	cur := c.domains[domain]
	if cur == nil {
		return m
	}
	var arr [128]byte
	buf := arr[:0]
	for i, e := range entries {
		buf = append(append(append(buf[:0], e.Key...), '_'), e.Value...)
		next := cur.children[string(buf)]
		if next == nil {
			for _, w := range cur.wildcards {
				if w.match(string(buf)) {
					next = cur.children[w.key]
					if next.share != "" {
						if m.shared == nil {
							m.shared = make([]string, len(entries))
						}
						m.shared[i] = next.share
					}
					break
				}
			}
		}
		if next == nil {
			next = cur.children[e.Key]
		}
		if next != nil && next.limit != nil && i == len(entries)-1 {
			m.limit = next.limit
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		cur = next
	}
	if m.limit == nil {
		m.shared = nil
	}
	return m
}

// wildcard is a descriptor entry whose "key_value" holds '*': each '*'
// stands for any run of characters, the empty one included, and the
// pattern must match the whole "key_value" of a request's entry. So
// "path_/api*" matches every value that begins with "/api", "route_a*b"
// those that begin with "a" and end with "b" ("ab" too), and
// "route_x*y*z" those that hold "x", "y", "z" in that order, from the
// first character to the last.
type wildcard struct {
	key string
	// parts are key split at each '*': a match begins with the first,
	// ends with the last, and holds the others in order between them.
	parts []string
	fixed int // the length of the parts together
}

func newWildcard(key string) wildcard {
	w := wildcard{key: key, parts: strings.Split(key, "*")}
	for _, p := range w.parts {
		w.fixed += len(p)
	}
	return w
}

// match reports whether s matches the pattern. Taking each middle part
// at its first place is enough: a later place leaves less room for the
// parts after it, never more.
func (w wildcard) match(s string) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if len(s) < w.fixed || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	rest := s[len(first) : len(s)-len(last)]
	for _, p := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// bucketKey is the drip key of a descriptor: the domain and every entry's
// key and value (a share_threshold wildcard's value stands for the values
// it matches), each length-prefixed so that no two descriptors share a key
// by accident. Rule names of drip's rules files cannot contain ':', so
// these keys never meet a rule's buckets.
func bucketKey(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry, shared []string) string {
	n := len("envoy:") + len(domain) + 4
	for _, e := range entries {
		n += len(e.Key) + len(e.Value) + 8
	}
	// A Builder's string is its buffer, not a copy of it: one allocation.
	var b strings.Builder
	b.Grow(n)
	b.WriteString("envoy:")
	netstring(&b, domain)
	for i, e := range entries {
		netstring(&b, e.Key)
		if shared != nil && shared[i] != "" {
			b.WriteByte('*')
			netstring(&b, shared[i])
			continue
		}
		netstring(&b, e.Value)
	}
	return store.FitKey(b.String()) // a long value (say, a path) is hashed, never refused
}

func netstring(b *strings.Builder, s string) {
	b.WriteString(strconv.Itoa(len(s))) // no allocation below 100
	b.WriteByte(':')
	b.WriteString(s)
}
