package testserver

import (
	"strings"
	"testing"
)

func TestRedisKillRestart(t *testing.T) {
	r := StartRedis(t)
	if _, err := r.Cli("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	r.Kill()
	if r.Running() {
		t.Fatal("running after Kill")
	}
	if _, err := r.Cli("PING"); err == nil {
		t.Fatal("a killed server answered PING")
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	// No persistence: a restarted server starts empty.
	if out, err := r.Cli("EXISTS", "k"); err != nil || strings.TrimSpace(out) != "0" {
		t.Fatalf("EXISTS k after restart = %q, %v; want 0", out, err)
	}
	if !strings.HasPrefix(r.URL(), "redis://127.0.0.1:") {
		t.Fatalf("URL %q", r.URL())
	}
}

func TestSharedRedis(t *testing.T) {
	defer StopShared()
	a, b := SharedRedisURL(t), SharedRedisURL(t)
	if a != b {
		t.Fatalf("two shared servers: %s, %s", a, b)
	}
}
