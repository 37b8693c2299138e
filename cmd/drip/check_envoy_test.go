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
