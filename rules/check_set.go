package rules

import (
	"net/netip"
)

// The top level of a rules file.

var topFields = []string{"rules", "jwt", "trusted_proxies", "ipv6_prefix", "on_error", "local_share", "store_timeout", "circuit_breaker", "retry_after_jitter", "exact_paths", "key_secret_env", "prices"}

func (c *checker) set(v any) *Set {
	s := &Set{
		IPv6Prefix: DefaultIPv6Prefix,
		OnError:    Allow,
		LocalShare: DefaultLocalShare,
		Breaker:    DefaultBreaker,
		byName:     map[string]int{},
	}
	s.RetryJitter = DefaultJitter
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
	if v, p, ok := f.get("exact_paths"); ok {
		s.ExactPaths, _ = c.boolean(p, v)
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
	if v, p, ok := f.get("key_secret_env"); ok {
		s.KeySecretEnv, s.KeySecret = c.keySecret(p, v)
	} else if c.keyUser != "" {
		c.add("key_secret_env", "required: %s hashes its value; name the environment variable that holds the secret (at least %d bytes)", c.keyUser, minHMACSecret)
	}
	for i := range s.Rules {
		s.Rules[i].keySecret = s.KeySecret
	}
	if v, p, ok := f.get("prices"); ok {
		s.Prices = c.prices(p, v) // prices.go
	}
	c.priceRules(s)
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
	if v, p, ok := f.get("failure_ratio"); ok {
		b.FailureRatio, _ = c.share(p, v)
	}
	if v, p, ok := f.get("stall"); ok {
		if d, ok := c.duration(p, v, false); ok {
			b.Stall = d
		}
	}
	if v, p, ok := f.get("cooldown"); ok {
		if d, ok := c.duration(p, v, false); ok {
			b.Cooldown = d
		}
	}
	f.done("failures", "failure_ratio", "stall", "cooldown")
}

// keySecret reads key_secret_env and, when the checker has an
// environment, the secret in it.
func (c *checker) keySecret(p string, v any) (string, []byte) {
	name, ok := c.str(p, v)
	if !ok {
		return "", nil
	}
	if name == "" {
		c.add(p, "must name an environment variable")
		return "", nil
	}
	return name, c.readSecret(p, name, "hashed keys need", "")
}
