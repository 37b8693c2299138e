// Package redact hides credentials in store URLs and in the messages that
// may quote them, before anything is logged, printed or answered: every
// place that shows a store URL or a store's error goes through it.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Mask replaces a hidden secret.
const Mask = "xxxxx"

// secretParam says whether a query parameter (or connection-string key)
// carries a secret: auth, or a name ending in password, passwd, pass,
// pwd, secret or token (sslpassword, sentinel_password, client_secret,
// access_token ...), compared case-insensitively.
func secretParam(k string) bool {
	k = strings.ToLower(k)
	if k == "auth" {
		return true
	}
	for _, s := range []string{"password", "passwd", "pass", "pwd", "secret", "token"} {
		if strings.HasSuffix(k, s) {
			return true
		}
	}
	return false
}

// URL returns raw with the password of its userinfo and the values of its
// password-like query parameters replaced by Mask. Anything that does not
// parse as a URL goes through Text.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return Text(raw)
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), Mask)
	}
	if u.RawQuery != "" {
		q := u.Query()
		changed := false
		for k := range q {
			if secretParam(k) {
				q[k] = []string{Mask}
				changed = true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
	}
	// url.URL.String escapes the mask's nothing and keeps the rest as it
	// was parsed.
	return u.String()
}

var (
	// scheme://user:password@ anywhere in a text; the password runs to
	// the last @ before a space or quote, so that one holding @ or / is
	// hidden whole.
	userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@"'` + "`" + `]*):[^\s"'` + "`" + `]*@`)
	// password=... in a query string or a key=value connection string,
	// its value quoted or not (secretParam's names).
	param = regexp.MustCompile(`(?i)\b(auth|[a-z0-9_]*(?:password|passwd|pass|pwd|secret|token))=('[^']*'?|"[^"]*"?|[^&\s"'` + "`" + `]*)`)
)

// Text returns s with every URL password and password-like parameter in it
// replaced by Mask: for error messages that may quote a store URL.
func Text(s string) string {
	s = userinfo.ReplaceAllString(s, "${1}:"+Mask+"@")
	return param.ReplaceAllString(s, "${1}="+Mask)
}

// Error is err with its message passed through Text; it unwraps to err,
// so errors.Is and errors.As still see the original.
func Error(err error) error {
	if err == nil {
		return nil
	}
	msg := Text(err.Error())
	if msg == err.Error() {
		return err
	}
	return &redacted{msg: msg, err: err}
}

type redacted struct {
	msg string
	err error
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }
