package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestServeMisspeltVariable: a DRIP_ name two edits from one drip serve
// reads stops it at start, naming the variable it meant; any other DRIP_
// name (a rules file's secret) passes.
func TestServeMisspeltVariable(t *testing.T) {
	t.Setenv("DRIP_LISTEN", "127.0.0.1:0")
	t.Setenv("DRIP_ADMIN_LISTEN", "127.0.0.1:0")
	t.Setenv("DRIP_STOER", "redis://127.0.0.1:1")
	var out, errs bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // generous: a drip that starts anyway fails, not hangs
	defer cancel()
	code := run(ctx, []string{"serve", "--drain=0"}, strings.NewReader(""), &out, &errs)
	if code != 2 || !strings.Contains(errs.String(), "DRIP_STOER is set") || !strings.Contains(errs.String(), "did you mean DRIP_STORE?") {
		t.Fatalf("drip serve with DRIP_STOER: exit %d, stderr %q", code, errs.String())
	}
	if strings.Contains(errs.String(), "redis://") {
		t.Errorf("the error quotes the variable's value: %q", errs.String())
	}

	fs := newFlagSet("serve")
	fs.String("store", "", "")
	fs.String("admin-token-file", "", "")
	for env, want := range map[string]string{
		"DRIP_STORE=memory":                 "",
		"DRIP_STORE_FILE=/x":                "",
		"DRIP_KEY_SECRET=s3cr3t":            "",
		"DRIP_TEST_REDIS_URL=x":             "",
		"DRIP_ENVOY_LEASD=true":             "DRIP_ENVOY_LEASED",
		"DRIP_ADMIN_TOKEN_FIEL=/x":          "DRIP_ADMIN_TOKEN_FILE",
		"DRIP_STORES=redis://x":             "DRIP_STORE",
		"DRIP_STOER=":                       "", // empty: as if unset
		"DRIP_ENVOY_ALGORITHM=fixed_window": "",
	} {
		err := misspeltDRIP(fs, []string{"PATH=/bin", env})
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v, want no error", env, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), "did you mean "+want+"?")):
			t.Errorf("%s: %v, want did you mean %s", env, err, want)
		}
	}
}
