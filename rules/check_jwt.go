package rules

import (
	"path/filepath"
	"strings"
)

// The jwt section: how tokens are verified. With an environment (the
// loader) the secret and key files are read; without (Parse), only named.

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
		if b, ok := c.boolean(fp, v); ok {
			j.Verify = b
		}
	}
	if v, fp, ok := f.get("hmac_secret_env"); ok {
		ways = append(ways, "hmac_secret_env")
		if name, ok := c.str(fp, v); ok {
			if name == "" {
				c.add(fp, "must name an environment variable")
			} else {
				j.HMACSecretEnv = name
				c.secret(fp, name, j)
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
					j.PublicKeyFiles = append(j.PublicKeyFiles, resolve(base, name))
					if c.env == nil {
						continue
					}
					k, err := c.env.readPEMKey(resolve(base, name))
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
			j.JWKSFile = resolve(base, name)
			if c.env != nil {
				keys, errs := c.env.readJWKS(j.JWKSFile)
				for _, e := range errs {
					c.add(fp, "%s: %v", name, e)
				}
				if len(errs) == 0 && len(keys) == 0 {
					c.add(fp, "%s: holds no signing keys", name)
				}
				j.Keys = append(j.Keys, keys...)
			}
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

// secret reads the HMAC secret of j from environment variable name, when
// the checker has an environment.
func (c *checker) secret(fp, name string, j *JWT) {
	j.HMACSecret = c.readSecret(fp, name, "HMAC needs", " (RFC 7518 section 3.2)")
}

// readSecret reads a secret of at least minHMACSecret bytes from
// environment variable name, when the checker has an environment (nil
// otherwise, and when it is missing or short: a problem at fp, whose
// message says who needs it).
func (c *checker) readSecret(fp, name, needs, why string) []byte {
	if c.env == nil {
		return nil
	}
	switch sec := c.env.Getenv(name); {
	case sec == "":
		c.add(fp, "environment variable %s is not set or empty", name)
	case len(sec) < minHMACSecret:
		c.add(fp, "the secret in %s has %d bytes; %s at least %d%s", name, len(sec), needs, minHMACSecret, why)
	default:
		return []byte(sec)
	}
	return nil
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
