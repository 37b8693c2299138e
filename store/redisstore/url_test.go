package redisstore_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/driplimit/drip/store/redisstore"
)

func TestParseURLSentinel(t *testing.T) {
	for _, c := range []struct {
		url    string
		addrs  []string
		master string
		db     int
		user   string
		pass   string
		tls    bool
	}{
		{"redis+sentinel://10.0.0.1:26379/mymaster", []string{"10.0.0.1:26379"}, "mymaster", 0, "", "", false},
		{"redis+sentinel://a:1,b:2,c:3/mymaster/2", []string{"a:1", "b:2", "c:3"}, "mymaster", 2, "", "", false},
		{"redis+sentinel://u:p%40ss@a:1,b:2/m?dial_timeout=1s", []string{"a:1", "b:2"}, "m", 0, "u", "p@ss", false},
		{"rediss+sentinel://a:1,b:2/m", []string{"a:1", "b:2"}, "m", 0, "", "", true},
		{"redis://a:1?master_set=m&addr=b:2", []string{"a:1", "b:2"}, "m", 0, "", "", false},
	} {
		o, err := redisstore.ParseURL(c.url)
		if err != nil {
			t.Errorf("%s: %v", c.url, err)
			continue
		}
		if !slices.Equal(o.InitAddress, c.addrs) || o.Sentinel.MasterSet != c.master || o.SelectDB != c.db ||
			o.Username != c.user || o.Password != c.pass {
			t.Errorf("%s: addresses %v master %q db %d user %q password %q", c.url, o.InitAddress, o.Sentinel.MasterSet, o.SelectDB, o.Username, o.Password)
		}
		if o.Sentinel.TopologyRefreshInterval != redisstore.SentinelRefresh {
			t.Errorf("%s: no periodic refresh", c.url)
		}
		if (o.TLSConfig != nil) != c.tls || (o.Sentinel.TLSConfig != nil) != c.tls {
			t.Errorf("%s: TLS to servers %v, to Sentinels %v, want %v", c.url, o.TLSConfig != nil, o.Sentinel.TLSConfig != nil, c.tls)
		}
		if c.tls && o.TLSConfig.ServerName != "" {
			t.Errorf("%s: every server must be checked against its own host, not %q", c.url, o.TLSConfig.ServerName)
		}
	}
	for _, bad := range []string{
		"redis+sentinel://a:1/",
		"redis+sentinel://a:1,,b:2/m",
		"redis+sentinel://a:1/m/0/x",
		"redis+sentinel://a:1/m?master_set=n",
		"redis+sentinel://a:1/m/x",
		"sentinel://a:1/m",
		"redis://a:1?tls_ca_file=/x",
		"rediss://a:1?tls_ca_file=/does/not/exist",
		"rediss://a:1?tls_cert_file=/x",
	} {
		if _, err := redisstore.ParseURL(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	_, err := redisstore.ParseURL("redis+sentinel://user:secret@a:1/m/x")
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("error %v: want one without the password", err)
	}
}

// TestParseURLUnknownParameter: a parameter ParseURL does not take is
// refused, naming it and the nearest it takes, in every form of URL;
// ignored, it would start the store weaker than asked (keys under drip:
// for prefix=, the system's CAs for a misspelt tls_ca_file).
func TestParseURLUnknownParameter(t *testing.T) {
	for _, c := range []struct{ url, name, near string }{
		{"redis://:pw@h:6379?prefix=atk1:", `"prefix"`, "addr"},
		{"rediss://h:6380?tls_ca_flie=/ca.pem", `"tls_ca_flie"`, "tls_ca_file"},
		{"redis://h:7000?addr=h2:7001&adr=h3:7002", `"adr"`, "addr"},
		{"redis+sentinel://s1:26379,s2:26379/mymaster?dial_timout=1s", `"dial_timout"`, "dial_timeout"},
		{"rediss+sentinel://s1:26379/mymaster?tls_servername=r", `"tls_servername"`, "tls_server_name"},
		{"redis://h:6379?password=pw", `"password"`, ""},
	} {
		_, err := redisstore.ParseURL(c.url)
		if err == nil || !strings.Contains(err.Error(), "unknown URL parameter "+c.name) || !strings.Contains(err.Error(), "nearest known is "+c.near) {
			t.Errorf("%s: %v", c.url, err)
		}
		if err != nil && strings.Contains(err.Error(), "pw") {
			t.Errorf("%s: the error shows the password: %v", c.url, err)
		}
	}
	if _, err := redisstore.ParseURL("redis://h:6379?prefix=x"); err == nil || !strings.Contains(err.Error(), "keys go under the prefix drip:") {
		t.Errorf("prefix: %v", err)
	}
}
