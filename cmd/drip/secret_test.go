package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestNoSecretInStartupErrors: a store URL or credential that stops drip
// at start, in every form a deployment gives one (a Redis add-on's
// REDIS_URL, rediss://, cluster and Sentinel entries, PostgreSQL URLs and
// key=value strings, a password in a query parameter, user:password), is
// never printed whole: the fatal errors of drip serve --store and of
// drip run as ratelimit name the problem with the secret masked.
func TestNoSecretInStartupErrors(t *testing.T) {
	const pw = "Hx7s3cretPw" // appears nowhere but where the test puts it
	for _, tc := range []struct {
		name  string
		args  []string          // drip serve's arguments (besides the listeners)
		env   map[string]string // run as ratelimit with this environment
		where string            // a word the error must say, so that it is the one meant
		down  bool              // a store that does not answer: drip starts without it, and says so
	}{
		// drip serve --store
		{name: "redis unreachable", args: []string{"--store", "redis://:" + pw + "@127.0.0.1:1"}, where: "redis", down: true},
		{name: "redis bad port", args: []string{"--store", "redis://:" + pw + "@h:port"}, where: "port"},
		{name: "redis user and password", args: []string{"--store", "redis://default:" + pw + "@h:-1/0"}, where: "redis"},
		{name: "redis password with @ and /", args: []string{"--store", "redis://:" + pw + "@x/y@h:port"}, where: "redis"},
		{name: "rediss unreachable", args: []string{"--store", "rediss://default:" + pw + "@127.0.0.1:1?tls_server_name=r"}, where: "redis", down: true},
		{name: "rediss bad CA", args: []string{"--store", "rediss://:" + pw + "@127.0.0.1:1?tls_ca_file=/nonexistent/ca.pem"}, where: "tls_ca_file"},
		{name: "cluster", args: []string{"--store", "redis://:" + pw + "@127.0.0.1:1?addr=127.0.0.1:2&addr=127.0.0.1:3"}, where: "redis", down: true},
		{name: "cluster bad entry", args: []string{"--store", "redis://:" + pw + "@127.0.0.1:1?addr=%zz"}, where: "redis", down: true},
		{name: "sentinel", args: []string{"--store", "redis+sentinel://:" + pw + "@127.0.0.1:1,127.0.0.1:2/mymaster"}, where: "redis", down: true},
		{name: "sentinel empty entry", args: []string{"--store", "rediss+sentinel://u:" + pw + "@127.0.0.1:1,,/mymaster"}, where: "Sentinel"},
		{name: "postgres unreachable", args: []string{"--store", "postgres://u:" + pw + "@127.0.0.1:1/db?connect_timeout=5"}, where: "pgstore", down: true},
		{name: "postgres password parameter", args: []string{"--store", "postgres://u@127.0.0.1:1/db?connect_timeout=5&password=" + pw}, where: "pgstore", down: true},
		{name: "postgres bad URL", args: []string{"--store", "postgresql://u:" + pw + "@[::1/db"}, where: "pgstore"},
		{name: "postgres unknown drip parameter", args: []string{"--store", "postgres://u:" + pw + "@127.0.0.1:1/db?drip_bach=1"}, where: "drip_bach"},
		{name: "unknown scheme", args: []string{"--store", "memcache://u:" + pw + "@h:11211"}, where: "unknown store"},
		{name: "key=value string", args: []string{"--store", "host=h user=u password='" + pw + " x' dbname=d"}, where: "unknown store"},
		{name: "gateway upstream", args: []string{"--listen", "127.0.0.1:0", "--upstream", "ftp://u:" + pw + "@app:21"}, where: "upstream"},
		{name: "a token parameter", args: []string{"--store", "redis://127.0.0.1:1?client_secret=" + pw}, where: "redis"},

		// envoyproxy/ratelimit's variables: REDIS_URL and REDIS_AUTH
		{name: "REDIS_URL as a Redis add-on sets it", env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis://:" + pw + "@ec2-1-2-3-4.compute.example:6379"}, where: "REDIS_URL"},
		{name: "REDIS_URL rediss", env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "rediss://h:" + pw + "@r.example:6380"}, where: "REDIS_URL"},
		{name: "REDIS_URL cluster entry", env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": "n1:7000,redis://:" + pw + "@n2:7001"}, where: "REDIS_URL"},
		{name: "REDIS_URL sentinel entry", env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,s1:26379,:" + pw + "@s2"}, where: "REDIS_URL"},
		{name: "REDIS_URL password only", env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": ":" + pw + "@r:6379"}, where: "REDIS_URL"},
		{name: "REDIS_AUTH, Redis unreachable", env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:1", "REDIS_AUTH": "u:" + pw}, where: "redis", down: true},
		{name: "xDS headers", env: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "Bearer " + pw}, where: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"serve", "--drain=0", "--listen", "off", "--admin-listen", "off", "--store-timeout", "2s"}, tc.args...)
			if tc.env != nil {
				for k, v := range tc.env {
					t.Setenv(k, v)
				}
				t.Setenv("GRPC_HOST", "127.0.0.1")
				t.Setenv("GRPC_PORT", "0")
				t.Setenv("HOST", "127.0.0.1")
				t.Setenv("PORT", "0")
				args = args[:len(args)-len(tc.args)]
			}
			// Refused at start: were it served, the context's end stops it
			// (0). A store that does not answer is no refusal: drip
			// starts without it (after the store deadline, 2 s), logs each
			// attempt to connect, and is stopped as soon as it has said
			// the store does not answer (or at the generous deadline).
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var out, errs lockedBuffer
			if tc.down {
				go func() {
					tick := time.NewTicker(20 * time.Millisecond)
					defer tick.Stop()
					for {
						select {
						case <-ctx.Done():
							return
						case <-tick.C:
						}
						if strings.Contains(out.String()+errs.String(), "does not answer") {
							cancel()
							return
						}
					}
				}()
			}
			code := run(ctx, args, strings.NewReader(""), &out, &errs)
			all := out.String() + errs.String()
			switch {
			case tc.down && code != 0:
				t.Fatalf("exit %d with the store down, want it to start without its store:\n%s", code, all)
			case tc.down && !strings.Contains(all, "does not answer"):
				t.Fatalf("nothing says the store does not answer:\n%s", all)
			case !tc.down && code == 0:
				t.Fatalf("started:\n%s", all)
			}
			if strings.Contains(all, pw) || strings.Contains(all, pw[2:8]) {
				t.Errorf("the secret is shown:\n%s", all)
			}
			if !strings.Contains(strings.ToLower(all), strings.ToLower(tc.where)) {
				t.Errorf("the error does not say %q:\n%s", tc.where, all)
			}
		})
	}
}
