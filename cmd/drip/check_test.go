package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte(`{"rules": [{"name": "free", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rps": 10, "burst": 20}}]}`), 0o644)
	os.WriteFile(bad, []byte(`rules:
  - name: free
    limit_keys: ["header:x-api-key"]
    algorithm_config: {rps: 10, burst: 0}
  - name: free
    limit_keys: ["nowhere"]
    algorithm_config: {rps: 1, colour: blue}
`), 0o644)

	var out, errs bytes.Buffer
	if code := run(t.Context(), []string{"check", good}, nil, &out, &errs); code != 0 {
		t.Fatalf("check of a good file: exit %d\n%s", code, errs.String())
	}
	if !strings.Contains(out.String(), "good.json: ok, 1 rule(s)") {
		t.Fatalf("check of a good file says %q", out.String())
	}

	out.Reset()
	errs.Reset()
	code := run(t.Context(), []string{"check", good, bad}, nil, &out, &errs)
	if code != 1 {
		t.Fatalf("check of a bad file: exit %d, want 1", code)
	}
	// Every problem, each with its path, in one run.
	for _, want := range []string{
		"bad.yaml:4: rules[0].algorithm_config.burst: must be > 0",
		"bad.yaml:5: rules[1].name",
		"bad.yaml:6: rules[1].limit_keys[0]",
		"bad.yaml:7: rules[1].algorithm_config.colour",
	} {
		if !strings.Contains(errs.String(), want) {
			t.Errorf("check output lacks %q:\n%s", want, errs.String())
		}
	}
	if !strings.Contains(out.String(), "good.json: ok") {
		t.Errorf("the good file beside the bad one is not reported: %q", out.String())
	}

	for _, args := range [][]string{{"check"}, {"check", "-x"}} {
		if code := run(t.Context(), args, nil, &out, &errs); code != 2 {
			t.Errorf("drip %v: exit %d, want 2", args, code)
		}
	}
	if code := run(t.Context(), []string{"check", filepath.Join(dir, "missing.json")}, nil, &out, &errs); code != 1 {
		t.Errorf("check of a missing file: exit %d, want 1", code)
	}
}
