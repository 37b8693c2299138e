package main

import (
	"testing"

	"github.com/driplimit/drip/server"
	"github.com/driplimit/drip/server/envoy"
)

// TestEnvoyEnv: envoyproxy/ratelimit's variables reach drip serve's
// configuration, and --rules wins over RUNTIME_ROOT.
func TestEnvoyEnv(t *testing.T) {
	t.Setenv("RUNTIME_ROOT", "/data")
	t.Setenv("RUNTIME_SUBDIRECTORY", "ratelimit")
	t.Setenv("MERGE_DOMAIN_CONFIG", "true")
	t.Setenv("SHADOW_MODE", "false")
	t.Setenv("RUNTIME_IGNOREDOTFILES", "true")
	var c server.Config
	if err := envoyEnv(&c); err != nil {
		t.Fatal(err)
	}
	if c.Rules != "/data/ratelimit/config" || c.Envoy != (envoy.Options{MergeDomains: true, IgnoreDotfiles: true}) {
		t.Fatalf("%q %+v", c.Rules, c.Envoy)
	}
	c = server.Config{Rules: "mine.yaml"}
	if err := envoyEnv(&c); err != nil || c.Rules != "mine.yaml" {
		t.Fatalf("%q %v", c.Rules, err)
	}
	t.Setenv("SHADOW_MODE", "sometimes")
	if err := envoyEnv(&c); err == nil {
		t.Fatal("SHADOW_MODE=sometimes accepted")
	}
}
