package main

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/testkit/testserver"
)

// TestServeAdminTokenFile: the admin token can come from a file (so that
// it is not in ps), by flag or DRIP_ADMIN_TOKEN_FILE; --help says so; and
// the token is never printed.
func TestServeAdminTokenFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adminRules := func(admin, token string) int {
		req, _ := http.NewRequest("GET", "http://"+admin+"/v1/admin/rules", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, how := range []string{"flag", "env"} {
		args := []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
		if how == "flag" {
			args = append(args, "--admin-token-file", file)
		} else {
			t.Setenv("DRIP_ADMIN_TOKEN_FILE", file)
		}
		_, admin, stop := serveInProcess(t, args...)
		if code := adminRules(admin, "s3cret-token"); code != http.StatusOK {
			t.Errorf("%s: the admin API with the file's token: %d, want 200", how, code)
		}
		if code := adminRules(admin, "s3cret-token2"); code != http.StatusUnauthorized {
			t.Errorf("%s: the admin API with a wrong token: %d, want 401", how, code)
		}
		stop()
	}

	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte(" \n"), 0o600)
	t.Setenv("DRIP_ADMIN_TOKEN_FILE", "")
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--admin-token-file", filepath.Join(dir, "missing")}, "no such file"},
		{[]string{"--admin-token-file", empty}, "empty"},
		{[]string{"--admin-token-file", file, "--admin-token", "other"}, "both set"},
	} {
		var out, errs bytes.Buffer
		args := append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, tc.args...)
		if code := run(t.Context(), args, strings.NewReader(""), &out, &errs); code != 2 || !strings.Contains(errs.String(), tc.msg) {
			t.Errorf("drip %v: exit %d, stderr %q; want exit 2 with %q", tc.args, code, errs.String(), tc.msg)
		}
		if strings.Contains(out.String()+errs.String(), "s3cret") {
			t.Errorf("drip %v printed the token", tc.args)
		}
	}

	var out, errs bytes.Buffer
	run(t.Context(), []string{"serve", "--help"}, strings.NewReader(""), &out, &errs)
	if !strings.Contains(out.String()+errs.String(), "admin-token-file") {
		t.Errorf("drip serve --help does not mention --admin-token-file:\n%s%s", out.String(), errs.String())
	}
}

// TestServeStoreFile: the store URL, which may hold a password, can come
// from a file (a mounted Secret), by flag or DRIP_STORE_FILE: drip serve
// decides on the Redis server it names, and never prints the password;
// with --store too, or a file that is missing or empty, it refuses to
// start. drip pg install reads its URL from a file too (--url-file).
func TestServeStoreFile(t *testing.T) {
	// An ACL user beside the default one (which the harness pings).
	srv := testserver.StartRedis(t, "--user", "rl", "on", ">s3cret", "~*", "&*", "+@all")
	dir := t.TempDir()
	file := filepath.Join(dir, "url")
	if err := os.WriteFile(file, []byte("redis://rl:s3cret@"+srv.Addr+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, how := range []string{"flag", "env"} {
		args := []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
		if how == "flag" {
			args = append(args, "--store-file", file)
		} else {
			t.Setenv("DRIP_STORE_FILE", file)
		}
		api, _, stop := serveInProcess(t, args...)
		code, out := httpDo(t, "POST", "http://"+api+"/v1/take", `{"key": "k`+strconv.Itoa(i)+`", "limit": {"rate": 1, "burst": 1}}`)
		if code != 200 || !strings.Contains(out, `"allowed":true`) {
			t.Fatalf("%s: a take on the file's store: %d %s", how, code, out)
		}
		if n, err := srv.Cli("DBSIZE"); err != nil || strings.TrimSpace(n) != strconv.Itoa(i+1) {
			t.Fatalf("%s: keys in Redis: %q %v, want %d", how, n, err, i+1)
		}
		stop()
	}
	t.Setenv("DRIP_STORE_FILE", "")

	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--store-file", filepath.Join(dir, "missing")}, "no such file"},
		{[]string{"--store-file", empty}, "empty"},
		{[]string{"--store-file", file, "--store", "memory"}, "both set"},
	} {
		var out, errs bytes.Buffer
		args := append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, tc.args...)
		if code := run(t.Context(), args, strings.NewReader(""), &out, &errs); code != 2 || !strings.Contains(errs.String(), tc.msg) {
			t.Errorf("drip %v: exit %d, stderr %q; want exit 2 with %q", tc.args, code, errs.String(), tc.msg)
		}
		if strings.Contains(out.String()+errs.String(), "s3cret") {
			t.Errorf("drip %v printed the password", tc.args)
		}
	}

	pgFile := filepath.Join(dir, "pg")
	if err := os.WriteFile(pgFile, []byte(testserver.SharedPostgres(t).URL()), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	if code := run(t.Context(), []string{"pg", "install", "--url-file", pgFile}, strings.NewReader(""), &out, &errs); code != 0 || !strings.Contains(out.String(), "installed") {
		t.Errorf("drip pg install --url-file: exit %d, %s%s", code, out.String(), errs.String())
	}
	if code := run(t.Context(), []string{"pg", "install", "--url-file", pgFile, "--url", "postgres://x@h/db"}, strings.NewReader(""), &out, &errs); code != 2 || !strings.Contains(errs.String(), "both set") {
		t.Errorf("drip pg install --url-file --url: exit %d, %s", code, errs.String())
	}
}
