package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/driplimit/drip/internal/nearest"
)

// SentinelRefresh is how often a store opened on Sentinel asks the
// Sentinels which server is the master, besides following their
// +switch-master events (a missed event would otherwise leave it on a
// demoted master until restarted).
const SentinelRefresh = 5 * time.Second

// ParseURL turns a store URL into rueidis's client options. It takes
// every form Open does:
//
//	redis://[user:pass@]host:port[/db][?addr=host:port...]
//	rediss://...                           the same over TLS
//	redis+sentinel://[user:pass@]host:port[,host:port...]/master[/db]
//	rediss+sentinel://...                  the same over TLS (Sentinels too)
//	redis://host:port?master_set=master    Sentinel in rueidis's form
//
// and, besides rueidis's parameters (dial_timeout, ...), drip's TLS ones
// for rediss:
//
//	tls_ca_file=/path       PEM certificates to trust instead of the system's
//	tls_cert_file=/path     with tls_key_file: a client certificate
//	tls_key_file=/path
//	tls_server_name=name    the name the server's certificate must carry
//	                        (default: the host of each address)
//
// In the Sentinel forms, user and password are the master's and replicas';
// the Sentinels are reached without them. Any other parameter is an
// error that names the nearest known one: ignored, a misspelt
// tls_ca_file would trust the system's CAs instead.
func ParseURL(raw string) (rueidis.ClientOption, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return rueidis.ClientOption{}, errors.New("redisstore: bad URL: no scheme")
	}
	sentinel := false
	switch scheme {
	case "redis+sentinel", "rediss+sentinel":
		sentinel = true
		var err error
		if raw, err = sentinelToRueidis(strings.TrimSuffix(scheme, "+sentinel"), rest); err != nil {
			return rueidis.ClientOption{}, err
		}
	case "redis", "rediss":
	default:
		return rueidis.ClientOption{}, fmt.Errorf("redisstore: URL scheme %q: want redis, rediss, redis+sentinel or rediss+sentinel", scheme)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return rueidis.ClientOption{}, fmt.Errorf("redisstore: bad URL: %w", withoutURL(err))
	}
	q := u.Query()
	if err := checkParams(q); err != nil {
		return rueidis.ClientOption{}, err
	}
	tlsParams := map[string]string{}
	for _, k := range []string{"tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name"} {
		if q.Has(k) {
			tlsParams[k] = q.Get(k)
			q.Del(k)
		}
	}
	u.RawQuery = q.Encode()
	o, err := rueidis.ParseURL(u.String())
	if err != nil {
		return o, fmt.Errorf("redisstore: %w", withoutURL(err))
	}
	if len(tlsParams) > 0 && o.TLSConfig == nil {
		return o, errors.New("redisstore: tls_* parameters need a rediss:// URL")
	}
	if o.TLSConfig != nil {
		if err := configureTLS(o.TLSConfig, tlsParams); err != nil {
			return o, err
		}
	}
	if o.Sentinel.MasterSet != "" {
		sentinel = true
	}
	if sentinel {
		o.Sentinel.TopologyRefreshInterval = SentinelRefresh
		if o.TLSConfig != nil {
			if tlsParams["tls_server_name"] == "" {
				// Each server (Sentinel, master, replica) is checked
				// against the host it is reached at.
				o.TLSConfig.ServerName = ""
			}
			o.Sentinel.TLSConfig = o.TLSConfig.Clone()
		}
	}
	return o, nil
}

// knownParams are the URL parameters ParseURL takes: rueidis's and
// drip's TLS ones.
var knownParams = []string{
	"addr", "db", "dial_timeout", "write_timeout", "skip_verify", "protocol", "client_cache", "max_retries",
	"client_name", "master_set", "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name",
}

// checkParams refuses a parameter ParseURL does not take, naming the
// nearest it does: ignored, a misspelt tls_ca_file would trust the
// system's CAs, a prefix= would leave keys under drip:.
func checkParams(q url.Values) error {
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if slices.Contains(knownParams, k) {
			continue
		}
		near, _ := nearest.Name(k, knownParams)
		hint := ""
		if strings.Contains(strings.ToLower(k), "prefix") {
			hint = "; keys go under the prefix drip: (WithPrefix in Go): keep deployments apart with a database of their own (/db)"
		}
		return fmt.Errorf("redisstore: unknown URL parameter %q (the nearest known is %s)%s", k, near, hint)
	}
	return nil
}

// sentinelToRueidis rewrites the authority and path of a redis+sentinel
// URL (host:port[,host:port...]/master[/db]) into rueidis's form:
// the first Sentinel as the host, the others as addr parameters, the
// master's name as master_set.
func sentinelToRueidis(scheme, rest string) (string, error) {
	authority, path, query := rest, "", ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, path = rest[:i], rest[i:]
	}
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path, query = path[:i], path[i+1:]
	}
	userinfo := ""
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		userinfo, authority = authority[:i+1], authority[i+1:]
	}
	hosts := strings.Split(authority, ",")
	for _, h := range hosts {
		if h == "" {
			return "", errors.New("redisstore: bad Sentinel URL: an empty Sentinel address")
		}
	}
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if parts[0] == "" || len(parts) > 2 {
		return "", errors.New("redisstore: bad Sentinel URL: want redis+sentinel://host:port[,host:port...]/master_name[/db]")
	}
	master, err := url.PathUnescape(parts[0])
	if err != nil {
		return "", fmt.Errorf("redisstore: bad Sentinel URL: master name: %w", err)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", fmt.Errorf("redisstore: bad Sentinel URL: %w", err)
	}
	if q.Has("master_set") {
		return "", errors.New("redisstore: bad Sentinel URL: the master's name is in the path, not in master_set")
	}
	q.Set("master_set", master)
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	db := ""
	if len(parts) == 2 {
		db = "/" + parts[1]
	}
	return scheme + "://" + userinfo + hosts[0] + db + "?" + q.Encode(), nil
}

// configureTLS applies drip's tls_* parameters to c.
func configureTLS(c *tls.Config, p map[string]string) error {
	if f := p["tls_ca_file"]; f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("redisstore: tls_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("redisstore: tls_ca_file %s: no PEM certificate in it", f)
		}
		c.RootCAs = pool
	}
	if (p["tls_cert_file"] == "") != (p["tls_key_file"] == "") {
		return errors.New("redisstore: tls_cert_file and tls_key_file go together")
	}
	if p["tls_cert_file"] != "" {
		cert, err := tls.LoadX509KeyPair(p["tls_cert_file"], p["tls_key_file"])
		if err != nil {
			return fmt.Errorf("redisstore: client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if n := p["tls_server_name"]; n != "" {
		c.ServerName = n
	}
	return nil
}

// withoutURL drops a password from a URL parsing error (url.Error quotes the
// URL whole).
func withoutURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
