package main

import (
	"os"
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
	if _, err := envoyEnv(&c, os.Getenv, none); err != nil {
		t.Fatal(err)
	}
	if c.Rules != "/data/ratelimit/config" || c.Envoy != (envoy.Options{MergeDomains: true, IgnoreDotfiles: true}) {
		t.Fatalf("%q %+v", c.Rules, c.Envoy)
	}
	if c.GRPCListen != "" {
		t.Fatalf("gRPC listener %q without GRPC_HOST or GRPC_PORT", c.GRPCListen)
	}
	c = server.Config{Rules: "mine.yaml"}
	if _, err := envoyEnv(&c, os.Getenv, func(f string) bool { return f == "rules" }); err != nil || c.Rules != "mine.yaml" {
		t.Fatalf("%q %v", c.Rules, err)
	}
	t.Setenv("GRPC_PORT", "9081")
	c = server.Config{}
	if _, err := envoyEnv(&c, os.Getenv, none); err != nil || c.GRPCListen != "0.0.0.0:9081" {
		t.Fatalf("GRPC_PORT=9081: %q %v", c.GRPCListen, err)
	}
	c = server.Config{GRPCListen: "127.0.0.1:7000"} // --grpc-listen wins
	if _, err := envoyEnv(&c, os.Getenv, func(f string) bool { return f == "grpc-listen" }); err != nil || c.GRPCListen != "127.0.0.1:7000" {
		t.Fatalf("--grpc-listen: %q %v", c.GRPCListen, err)
	}
	t.Setenv("GRPC_HOST", "::1")
	t.Setenv("GRPC_PORT", "")
	c = server.Config{}
	if _, err := envoyEnv(&c, os.Getenv, none); err != nil || c.GRPCListen != "[::1]:8081" {
		t.Fatalf("GRPC_HOST=::1: %q %v", c.GRPCListen, err)
	}
	t.Setenv("GRPC_PORT", "http")
	if _, err := envoyEnv(&server.Config{}, os.Getenv, none); err == nil {
		t.Fatal("GRPC_PORT=http accepted")
	}
	t.Setenv("GRPC_PORT", "")
	t.Setenv("GRPC_HOST", "")
	t.Setenv("SHADOW_MODE", "sometimes")
	if _, err := envoyEnv(&c, os.Getenv, none); err == nil {
		t.Fatal("SHADOW_MODE=sometimes accepted")
	}
}

// none: no drip setting given.
func none(string) bool { return false }
