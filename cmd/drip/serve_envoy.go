package main

import (
	"os"

	"github.com/driplimit/drip/server"
	"github.com/driplimit/drip/server/envoy"
)

// envoyEnv applies envoyproxy/ratelimit's environment variables to c, so
// that a deployment's settings carry over: those of envoy.OptionsFromEnv
// always; RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY name
// the rules directory when neither --rules nor DRIP_RULES does, and
// GRPC_HOST and GRPC_PORT the gRPC listener when neither --grpc-listen nor
// DRIP_GRPC_LISTEN does.
func envoyEnv(c *server.Config) error {
	opts, err := envoy.OptionsFromEnv(os.Getenv)
	if err != nil {
		return err
	}
	c.Envoy = opts
	if c.Rules == "" {
		c.Rules = envoy.RuntimeDir(os.Getenv)
	}
	if c.GRPCListen == "" {
		if c.GRPCListen, err = envoy.GRPCListen(os.Getenv); err != nil {
			return err
		}
	}
	return nil
}
