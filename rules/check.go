package rules

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/driplimit/drip"
)

// checker turns plain values into a Set, collecting every problem.
type checker struct {
	file     string
	problems []Problem
	jwtUser  string // the first rule that reads jwt: claims
}

func (c *checker) add(path, format string, args ...any) {
	c.problems = append(c.problems, Problem{Path: path, Message: fmt.Sprintf(format, args...)})
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
	case math.Round(f*drip.Micro) == 0:
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
	d, err := drip.ParseSeconds(v)
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

var topFields = []string{"rules", "jwt", "trusted_proxies", "ipv6_prefix", "on_error", "local_share", "store_timeout", "circuit_breaker", "retry_after_jitter"}

func (c *checker) set(v any) *Set {
	s := &Set{
		IPv6Prefix: DefaultIPv6Prefix,
		OnError:    Allow,
		LocalShare: DefaultLocalShare,
		Breaker:    Breaker{Failures: DefaultBreakerFailures, Cooldown: DefaultBreakerCooldown},
		byName:     map[string]int{},
	}
	s.RetryJitter = drip.DefaultRetryJitter
	f, ok := c.object("", v)
	if !ok {
		c.problems[len(c.problems)-1].Message = "the file must hold an object with \"rules\", not " + kindOf(v)
		return s
	}
	// Global settings first: rules inherit on_error and local_share.
	if v, p, ok := f.get("on_error"); ok {
		if e, ok := c.enum(p, v, "allow", "deny", "local"); ok {
			s.OnError = OnError(e)
		}
	}
	if v, p, ok := f.get("local_share"); ok {
		s.LocalShare, _ = c.share(p, v)
	}
	if v, p, ok := f.get("ipv6_prefix"); ok {
		if n, ok := c.integer(p, v, 1, 128); ok {
			s.IPv6Prefix = n
		}
	}
	if v, p, ok := f.get("trusted_proxies"); ok {
		s.TrustedProxies = c.proxies(p, v)
	}
	if v, p, ok := f.get("store_timeout"); ok {
		s.StoreTimeout, _ = c.duration(p, v, false)
	}
	if v, p, ok := f.get("circuit_breaker"); ok {
		c.breaker(p, v, &s.Breaker)
	}
	if v, p, ok := f.get("retry_after_jitter"); ok {
		c.retryJitter(p, v, &s.RetryJitter)
	}
	var jwtPath string
	var jwtVal any
	if v, p, ok := f.get("jwt"); ok {
		jwtPath, jwtVal = p, v
	}
	rv, rp, ok := f.get("rules")
	if !ok {
		c.add("rules", "required")
	} else if l, ok := c.list(rp, rv); ok {
		names := map[string]int{}
		for i, r := range l {
			p := index(rp, i)
			rule, ok := c.rule(p, r, s)
			rule.Index = i
			if rule.Name != "" {
				if j, dup := names[rule.Name]; dup {
					c.add(p+".name", "%q is already the name of rules[%d]", rule.Name, j)
					continue
				}
				names[rule.Name] = i
			}
			if ok {
				s.byName[rule.Name] = len(s.Rules)
				s.Rules = append(s.Rules, rule)
			}
		}
	}
	f.done(topFields...)
	if jwtVal != nil || jwtPath != "" {
		s.JWT = c.jwt(jwtPath, jwtVal)
	} else if c.jwtUser != "" {
		c.add("jwt", "required: %s reads jwt: claims; set hmac_secret_env, public_key_files or jwks_file, or \"verify\": false", c.jwtUser)
	}
	return s
}

func (c *checker) share(p string, v any) (float64, bool) {
	f, ok := c.num(p, v)
	if !ok {
		return DefaultLocalShare, false
	}
	if f <= 0 || f > 1 {
		c.add(p, "must be > 0 and <= 1")
		return DefaultLocalShare, false
	}
	return f, true
}

func (c *checker) proxies(p string, v any) []netip.Prefix {
	l, ok := c.list(p, v)
	if !ok {
		return nil
	}
	var out []netip.Prefix
	for i, x := range l {
		ip := index(p, i)
		s, ok := c.str(ip, x)
		if !ok {
			continue
		}
		if pf, err := netip.ParsePrefix(s); err == nil {
			out = append(out, pf.Masked())
			continue
		}
		if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		c.add(ip, "%q is not a CIDR (\"10.0.0.0/8\") or an IP address", s)
	}
	return out
}

func (c *checker) breaker(p string, v any, b *Breaker) {
	f, ok := c.object(p, v)
	if !ok {
		return
	}
	if v, p, ok := f.get("failures"); ok {
		if n, ok := c.integer(p, v, 1, 1_000_000); ok {
			b.Failures = n
		}
	}
	if v, p, ok := f.get("cooldown"); ok {
		if d, ok := c.duration(p, v, false); ok {
			b.Cooldown = d
		}
	}
	f.done("failures", "cooldown")
}

var ruleFields = []string{"name", "group", "limit_keys", "match", "mode", "algorithm", "algorithm_config", "on_error", "local_share"}

func (c *checker) rule(p string, v any, s *Set) (Rule, bool) {
	r := Rule{Mode: Enforce, OnError: s.OnError, LocalShare: s.LocalShare}
	f, ok := c.object(p, v)
	if !ok {
		return r, false
	}
	n := len(c.problems)
	if v, fp, ok := f.get("name"); !ok {
		c.add(p+".name", "required")
	} else if name, ok := c.str(fp, v); ok {
		if !validName(name) {
			c.add(fp, "must be 1 to %d letters, digits, '-', '_' or '.', not %q", maxRuleName, name)
		}
		r.Name = name
	}
	if v, fp, ok := f.get("group"); ok {
		if g, ok := c.str(fp, v); ok {
			if g == "" {
				c.add(fp, "must not be empty (leave it out for no group)")
			}
			r.Group = g
		}
	}
	if v, fp, ok := f.get("limit_keys"); !ok {
		c.add(p+".limit_keys", "required (use [\"global\"] for one bucket shared by every request)")
	} else {
		r.LimitKeys = c.limitKeys(fp, v)
	}
	if v, fp, ok := f.get("match"); ok {
		r.Match = c.match(fp, v)
	}
	if c.jwtUser == "" && r.usesJWT() {
		c.jwtUser = p
	}
	if v, fp, ok := f.get("mode"); ok {
		if m, ok := c.enum(fp, v, "enforce", "shadow"); ok {
			r.Mode = Mode(m)
		}
	}
	if v, fp, ok := f.get("on_error"); ok {
		if e, ok := c.enum(fp, v, "allow", "deny", "local"); ok {
			r.OnError = OnError(e)
		}
	}
	if v, fp, ok := f.get("local_share"); ok {
		r.LocalShare, _ = c.share(fp, v)
	}
	algo := drip.TokenBucket
	if v, fp, ok := f.get("algorithm"); ok {
		if a, ok := c.enum(fp, v, "token_bucket", "fixed_window"); ok {
			algo = drip.Algorithm(a)
		}
	}
	if v, fp, ok := f.get("algorithm_config"); !ok {
		c.add(p+".algorithm_config", "required")
	} else {
		c.algorithmConfig(fp, v, algo, &r)
	}
	f.done(ruleFields...)
	return r, len(c.problems) == n
}

func validName(s string) bool {
	if s == "" || len(s) > maxRuleName {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case 'a' <= ch && ch <= 'z', 'A' <= ch && ch <= 'Z', '0' <= ch && ch <= '9', ch == '-', ch == '_', ch == '.':
		default:
			return false
		}
	}
	return true
}

func (c *checker) limitKeys(p string, v any) []Source {
	l, ok := c.list(p, v)
	if !ok {
		return nil
	}
	if len(l) == 0 {
		c.add(p, "must not be empty (use [\"global\"] for one bucket shared by every request)")
		return nil
	}
	var out []Source
	seen := map[Source]int{}
	for i, x := range l {
		ip := index(p, i)
		s, ok := c.str(ip, x)
		if !ok {
			continue
		}
		src, err := ParseSource(s)
		if err != nil {
			c.add(ip, "%v", err)
			continue
		}
		if j, dup := seen[src]; dup {
			c.add(ip, "%q repeats %s[%d]", s, p, j)
			continue
		}
		seen[src] = i
		out = append(out, src)
	}
	return out
}

func (c *checker) match(p string, v any) []Condition {
	f, ok := c.object(p, v)
	if !ok {
		return nil
	}
	var out []Condition
	seen := map[Source]string{}
	for _, k := range f.o.keys {
		mv, mp, _ := f.get(k)
		src, err := ParseSource(k)
		if err != nil {
			c.add(mp, "%v", err)
			continue
		}
		if src.Kind == KindGlobal {
			c.add(mp, "global cannot be matched: it has no value")
			continue
		}
		if other, dup := seen[src]; dup {
			c.add(mp, "matches the same source as %s", other)
			continue
		}
		seen[src] = mp
		cond := Condition{Source: src}
		var vals []any
		if l, ok := mv.([]any); ok {
			if len(l) == 0 {
				c.add(mp, "must not be an empty list")
				continue
			}
			vals = l
		} else {
			vals = []any{mv}
		}
		for i, x := range vals {
			xp := mp
			if _, isList := mv.([]any); isList {
				xp = index(mp, i)
			}
			text, ok := scalarText(x)
			if !ok {
				c.add(xp, "must be a string (or a list of strings), not %s", kindOf(x))
				continue
			}
			if pre, ok := strings.CutSuffix(text, "*"); ok {
				cond.Prefixes = append(cond.Prefixes, pre)
			} else {
				cond.Values = append(cond.Values, text)
			}
		}
		out = append(out, cond)
	}
	return out
}

// scalarText is the text a match compares: strings as they are, numbers
// and booleans as written (YAML's `tier: 3` matches the claim 3).
func scalarText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return string(x), true
	case bool:
		return strconv.FormatBool(x), true
	}
	return "", false
}

var configFields = []string{"tokens_per_second", "rps", "rate", "period", "burst", "refill", "start", "max_reserved", "cost_source", "fixed_cost", "default_cost"}

func (c *checker) algorithmConfig(p string, v any, algo drip.Algorithm, r *Rule) {
	f, ok := c.object(p, v)
	if !ok {
		return
	}
	n := len(c.problems)
	l := drip.Limit{Algorithm: algo, Period: time.Second}
	var rateName string // the field the rate came from
	rateOK := false
	for _, name := range []string{"tokens_per_second", "rps", "rate"} {
		v, fp, ok := f.get(name)
		if !ok {
			continue
		}
		if rateName != "" {
			c.add(fp, "cannot be combined with %s (set one of tokens_per_second, rps or rate)", rateName)
			continue
		}
		rateName = name
		l.Rate, rateOK = c.amount(fp, v)
	}
	if rateName == "" {
		c.add(p, "one of tokens_per_second, rps or rate (with period) is required")
	}
	if v, fp, ok := f.get("period"); ok {
		if rateName != "" && rateName != "rate" {
			c.add(fp, "applies to rate only (%s is per second)", rateName)
		} else if d, ok := c.duration(fp, v, false); ok {
			l.Period = d
		}
	}
	burstOK := false
	if v, fp, ok := f.get("burst"); ok {
		if b, ok := c.amount(fp, v); ok {
			// A burst below the rate is a legitimate limit (a bucket that
			// holds less than a second's refill smooths traffic): rps and
			// tokens_per_second accept it like rate + period does.
			l.Burst = b
			burstOK = true
		}
	} else {
		l.Burst = l.Rate
		burstOK = rateOK
	}
	if v, fp, ok := f.get("refill"); ok {
		if algo != drip.TokenBucket {
			c.add(fp, "applies to token_bucket only")
		} else if s, ok := c.enum(fp, v, "continuous", "interval"); ok {
			l.Refill = drip.Refill(s)
		}
	}
	if v, fp, ok := f.get("start"); ok {
		if algo != drip.FixedWindow {
			c.add(fp, "applies to fixed_window only")
		} else if d, ok := c.duration(fp, v, true); ok {
			l.Start = d
			if d == 0 {
				l.Start = l.Period // an explicit 0 aligns windows with the epoch
			}
		}
	}
	if v, fp, ok := f.get("max_reserved"); ok {
		if m, ok := c.amount(fp, v); ok {
			l.MaxReserved = m
		}
	}
	r.CostSource = Source{Kind: KindFixed}
	r.FixedCost, r.DefaultCost = defaultCost, defaultCost
	if v, fp, ok := f.get("cost_source"); ok {
		if s, ok := c.str(fp, v); ok {
			src, err := ParseSource(s)
			switch {
			case s == "fixed":
			case err == nil && (src.Kind == KindHeader || src.Kind == KindQuery):
				r.CostSource = src
			default:
				c.add(fp, "must be \"fixed\", \"header:<name>\" or \"query:<name>\", not %q", s)
			}
		}
	}
	costAt := func(name string, applies bool, why string) float64 {
		v, fp, ok := f.get(name)
		if !ok {
			return defaultCost
		}
		if !applies {
			c.add(fp, "%s", why)
			return defaultCost
		}
		x, ok := c.amount(fp, v)
		if !ok {
			return defaultCost
		}
		if burstOK && x > l.Burst {
			c.add(fp, "must be <= burst (%s)", strconv.FormatFloat(l.Burst, 'g', -1, 64))
		}
		return x
	}
	fixed := r.CostSource.Kind == KindFixed
	r.FixedCost = costAt("fixed_cost", fixed, "applies to cost_source \"fixed\" only")
	r.DefaultCost = costAt("default_cost", !fixed, "applies to a header: or query: cost_source only")
	if fixed && !f.has("fixed_cost") && burstOK && l.Burst < defaultCost {
		c.add(p+".burst", "must be >= 1, the default fixed_cost (or set a smaller fixed_cost)")
	}
	if !fixed && !f.has("default_cost") && burstOK && l.Burst < defaultCost {
		c.add(p+".burst", "must be >= 1, the default default_cost (or set a smaller default_cost)")
	}
	f.done(configFields...)
	if len(c.problems) == n {
		if err := l.Validate(); err != nil {
			c.add(p, "%v", err)
		}
	}
	r.Limit = l
}

var jwtFields = []string{"hmac_secret_env", "public_key_files", "jwks_file", "verify", "issuer", "audience", "leeway"}

func (c *checker) jwt(p string, v any) *JWT {
	j := &JWT{Verify: true}
	f, ok := c.object(p, v)
	if !ok {
		return j
	}
	base := filepath.Dir(c.file)
	var ways []string
	if v, fp, ok := f.get("verify"); ok {
		if b, ok := v.(bool); !ok {
			c.add(fp, "must be true or false, not %s", kindOf(v))
		} else {
			j.Verify = b
		}
	}
	if v, fp, ok := f.get("hmac_secret_env"); ok {
		ways = append(ways, "hmac_secret_env")
		if name, ok := c.str(fp, v); ok {
			if name == "" {
				c.add(fp, "must name an environment variable")
			} else if sec := os.Getenv(name); sec == "" {
				c.add(fp, "environment variable %s is not set or empty", name)
			} else if len(sec) < minHMACSecret {
				c.add(fp, "the secret in %s has %d bytes; HMAC needs at least %d (RFC 7518 section 3.2)", name, len(sec), minHMACSecret)
			} else {
				j.HMACSecret = []byte(sec)
			}
		}
	}
	if v, fp, ok := f.get("public_key_files"); ok {
		ways = append(ways, "public_key_files")
		if l, ok := c.list(fp, v); ok {
			if len(l) == 0 {
				c.add(fp, "must not be empty")
			}
			for i, x := range l {
				ip := index(fp, i)
				if name, ok := c.str(ip, x); ok {
					k, err := readPEMKey(resolve(base, name))
					if err != nil {
						c.add(ip, "%s: %v", name, err)
						continue
					}
					j.Keys = append(j.Keys, PublicKey{Key: k})
				}
			}
		}
	}
	if v, fp, ok := f.get("jwks_file"); ok {
		ways = append(ways, "jwks_file")
		if name, ok := c.str(fp, v); ok {
			keys, errs := readJWKS(resolve(base, name))
			for _, e := range errs {
				c.add(fp, "%s: %v", name, e)
			}
			if len(errs) == 0 && len(keys) == 0 {
				c.add(fp, "%s: holds no signing keys", name)
			}
			j.Keys = append(j.Keys, keys...)
		}
	}
	if v, fp, ok := f.get("issuer"); ok {
		j.Issuer, _ = c.str(fp, v)
	}
	if v, fp, ok := f.get("audience"); ok {
		j.Audience, _ = c.str(fp, v)
	}
	if v, fp, ok := f.get("leeway"); ok {
		j.Leeway, _ = c.duration(fp, v, true)
	}
	f.done(jwtFields...)
	switch {
	case !j.Verify && len(ways) > 0:
		c.add(p, "\"verify\": false cannot be combined with %s", strings.Join(ways, " or "))
	case j.Verify && len(ways) == 0:
		c.add(p, "set one of hmac_secret_env, public_key_files or jwks_file, or \"verify\": false")
	case len(ways) > 1:
		c.add(p, "set only one of %s", strings.Join(ways, " and "))
	}
	return j
}

// minHMACSecret is the shortest HMAC secret accepted: a key as long as
// the SHA-256 output, as RFC 7518 requires for HS256.
const minHMACSecret = 32

func resolve(base, name string) string {
	if filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(base, name)
}

// suggest returns the name in known closest to k, if it is close.
func suggest(k string, known []string) string {
	best, bestD := "", 3
	for _, s := range known {
		if d := editDistance(strings.ToLower(k), s); d < bestD || (d == bestD && s < best) {
			best, bestD = s, d
		}
	}
	if bestD > 2 {
		return ""
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
