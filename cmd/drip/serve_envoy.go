package main

import (
	"os"

	"github.com/driplimit/drip/server"
	"github.com/driplimit/drip/server/envoy"
)

// envoyEnv applies envoyproxy/ratelimit's environment variables to c, so
// that a deployment's settings carry over: MERGE_DOMAIN_CONFIG,
// SHADOW_MODE and RUNTIME_IGNOREDOTFILES always; RUNTIME_ROOT,
// RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY name the rules directory
// when neither --rules nor DRIP_RULES does.
func envoyEnv(c *server.Config) error {
	opts, err := envoy.OptionsFromEnv(os.Getenv)
	if err != nil {
		return err
	}
	c.Envoy = opts
	if c.Rules == "" {
		c.Rules = envoy.RuntimeDir(os.Getenv)
	}
	return nil
}
