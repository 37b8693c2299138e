package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckEnvoy: drip check takes envoyproxy/ratelimit files and
// directories as drip serve --rules does.
func TestCheckEnvoy(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "rules.json"), []byte(`{"rules": [{"name": "free", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rps": 10, "burst": 20}}]}`), 0o644)
	os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n"), 0o644)
	var out, errs bytes.Buffer
	if code := run(t.Context(), []string{"check", dir, filepath.Join(dir, "edge.yaml")}, nil, &out, &errs); code != 0 {
		t.Fatalf("exit %d\n%s", code, errs.String())
	}
	for _, want := range []string{"rules.json: ok, 1 rule(s)", dir + ": ok, envoyproxy/ratelimit config of 1 domain(s) in 1 file(s)", "edge.yaml: ok, envoyproxy/ratelimit config of 1 domain(s)"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output %q lacks %q", out.String(), want)
		}
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("domain: bad\ndescriptors:\n  - key: a\n    rate_limit: {unit: sec, requests_per_unit: 1}\n"), 0o644)
	out.Reset()
	errs.Reset()
	if code := run(t.Context(), []string{"check", bad}, nil, &out, &errs); code != 1 {
		t.Fatalf("bad file: exit %d", code)
	}
	if want := bad + ":4: descriptors[0].rate_limit.unit: invalid rate limit unit 'sec'"; !strings.Contains(errs.String(), want) {
		t.Fatalf("errors %q lack %q", errs.String(), want)
	}
}

// TestCheckEnvoyEnv: drip check loads envoy files as drip serve does under
// envoyproxy/ratelimit's variables, and names a missing domain in its
// terms.
func TestCheckEnvoyEnv(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: edge\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, ".b.yaml"), []byte("domain: edge\ndescriptors:\n  - {key: b, rate_limit: {unit: second, requests_per_unit: 1}}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, ".editor.yaml"), []byte("font: mono\n"), 0o644)
	check := func() (int, string) {
		var out, errs bytes.Buffer
		code := run(t.Context(), []string{"check", dir}, nil, &out, &errs)
		return code, out.String() + errs.String()
	}
	if code, out := check(); code != 1 || !strings.Contains(out, `duplicate domain "edge"`) {
		t.Fatalf("dotfile of the same domain: exit %d\n%s", code, out)
	}
	t.Setenv("MERGE_DOMAIN_CONFIG", "true")
	if code, out := check(); code != 0 || !strings.Contains(out, "1 domain(s) in 2 file(s)") {
		t.Fatalf("merged: exit %d\n%s", code, out)
	}
	t.Setenv("MERGE_DOMAIN_CONFIG", "")
	t.Setenv("RUNTIME_IGNOREDOTFILES", "true")
	if code, out := check(); code != 0 || !strings.Contains(out, "1 domain(s) in 1 file(s)") {
		t.Fatalf("dotfiles ignored: exit %d\n%s", code, out)
	}

	nodomain := filepath.Join(t.TempDir(), "limits.yaml")
	os.WriteFile(nodomain, []byte("descriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n"), 0o644)
	var out, errs bytes.Buffer
	if code := run(t.Context(), []string{"check", nodomain}, nil, &out, &errs); code != 1 || !strings.Contains(errs.String(), "domain: config file cannot have empty domain") {
		t.Fatalf("no domain: exit %d\n%s%s", code, out.String(), errs.String())
	}
}
