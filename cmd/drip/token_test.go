package main

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
