package server

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/server/envoy"
)

// Envoy's rate limit service (Config.GRPCListen) and the rules it reads.
//
// --rules names a drip rules file, an envoyproxy/ratelimit configuration
// file (recognized by its top-level "domain" or "descriptors" key), or a
// directory of such files (*.yaml, *.yml, *.json; one domain per envoy
// file unless Config.Envoy merges them, as envoyproxy/ratelimit loads
// them, and at most one drip rules file; dotfiles count only when they are
// envoy files, and not at all with Config.Envoy.IgnoreDotfiles). The drip
// rules drive the decision API and the gateway (none when the path holds
// only envoy files); the envoy files drive the gRPC service and the
// admin listener's /json. Both reload together.

// envoyPrefix goes before the Envoy limits' names in the metrics' rule
// label.
const envoyPrefix = "envoy:"

// envoyService returns Envoy's rate limit service, made on first use (in
// New, never while serving): the gRPC listener and the admin listener's
// /json share it.
func (s *Server) envoyService() *envoy.Service {
	if s.rls == nil {
		// On the server's engine; its decisions count as rule
		// "envoy:<limit name or config path>".
		s.rls = envoy.NewService(s.store, s.rs.envoy, engine.Shared(s.eng))
		s.rls.Observe(s.metrics.obs.Prefixed(envoyPrefix), s.who.Prefixed(envoyPrefix))
	}
	return s.rls
}

// addGRPC adds the gRPC listener of Envoy's rate limit service.
func (s *Server) addGRPC() {
	s.envoyService()
	if s.xds == nil && len(s.rs.envoy.Domains()) == 0 {
		s.log.Warn("drip serve: --grpc-listen without an envoyproxy/ratelimit config in --rules: every ShouldRateLimit is OK")
	}
	var opts []grpc.ServerOption
	if s.cfg.TracerProvider != nil {
		opts = append(opts, s.tracedGRPC()) // trace.go
	}
	if s.cfg.GRPCTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.cfg.GRPCTLS)))
	}
	if s.xds != nil {
		opts = append(opts, grpc.ChainUnaryInterceptor(s.xdsGate)) // xds.go
	}
	g := envoy.NewServerWithLimits(s.rls, s.cfg.GRPCReflection, s.cfg.GRPCLimits, opts...)
	s.listeners = append(s.listeners, &listener{
		name:     "grpc",
		addr:     s.cfg.GRPCListen,
		serve:    g.Serve,
		drain:    g.Health.Shutdown, // NOT_SERVING; GOAWAY comes with Shutdown
		shutdown: g.Shutdown,
	})
}

// GRPCAddr is the address of Envoy's rate limit service, once Listen has
// bound it; nil before or when it is off.
func (s *Server) GRPCAddr() net.Addr { return s.addr("grpc") }

// ruleFile is one file found at the --rules path.
type ruleFile struct {
	name string
	data []byte
}

// readRuleFiles reads the files at path (a file, or a directory's rules
// files, dotfiles included unless opts.IgnoreDotfiles) and hashes their
// content.
func readRuleFiles(path string, opts envoy.Options) ([]ruleFile, [32]byte, error) {
	var hash [32]byte
	names, err := envoy.ConfigFilesWith(path, !opts.IgnoreDotfiles)
	if err != nil {
		return nil, hash, fmt.Errorf("rules: %w", err)
	}
	files := make([]ruleFile, 0, len(names))
	h := sha256.New()
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, hash, fmt.Errorf("rules: %w", err)
		}
		files = append(files, ruleFile{n, b})
		if len(names) == 1 {
			return files, sha256.Sum256(b), nil
		}
		h.Write([]byte(n + "\x00" + strconv.Itoa(len(b)) + "\x00"))
		h.Write(b)
	}
	copy(hash[:], h.Sum(nil))
	return files, hash, nil
}

// readRules reads and parses the rules at path: the drip rules (an empty
// set when path holds only envoyproxy/ratelimit files) and the envoy
// config (nil when there is none). The hash is set whenever the files
// could be read, even when they are not valid.
func readRules(path string, opts envoy.Options) (*rules.Set, *envoy.Config, [32]byte, error) {
	files, hash, err := readRuleFiles(path, opts)
	if err != nil {
		return nil, nil, hash, err
	}
	var drip []ruleFile
	var env []envoy.File
	// A directory's dotfiles count only when they are envoy files (an
	// editor's or a tool's are not drip rules).
	for _, f := range files {
		if envoy.IsConfig(f.data) {
			env = append(env, envoy.File{Name: f.name, Data: f.data})
		} else if f.name == path || !envoy.IsDotfile(f.name) {
			drip = append(drip, f)
		}
	}
	if len(drip)+len(env) == 0 {
		return nil, nil, hash, fmt.Errorf("rules: %s: no *.yaml, *.yml or *.json file in the directory but dotfiles that are not envoyproxy/ratelimit files", path)
	}
	var set *rules.Set
	var errs []error
	switch len(drip) {
	case 0:
		set, err = rules.Parse([]byte(`{"rules": []}`), filepath.Join(path, "(no drip rules)"))
		errs = append(errs, err)
	case 1:
		set, err = rules.ParseEnv(drip[0].data, drip[0].name, rules.OSEnv)
		errs = append(errs, err)
	default:
		names := make([]string, len(drip))
		for i, f := range drip {
			names[i] = filepath.Base(f.name)
		}
		errs = append(errs, fmt.Errorf("rules: %s holds %d drip rules files (%s): at most one, beside envoyproxy/ratelimit files (those with a top-level \"domain\")", path, len(drip), strings.Join(names, ", ")))
	}
	var cfg *envoy.Config
	if len(env) > 0 {
		cfg, err = envoy.ParseWith(opts, env...)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, hash, err
	}
	return set, cfg, hash, nil
}

// rulesStat is a cheap signature of the files at path (names, the files
// their symbolic links lead to, sizes and modification times), so that
// the watcher hashes them only when it moves. The link targets catch a
// Kubernetes ConfigMap update, which swaps a link to a new directory,
// even where the new file has the old one's size and a timestamp too
// coarse to differ.
func rulesStat(path string, opts envoy.Options) (string, error) {
	names, err := envoy.ConfigFilesWith(path, !opts.IgnoreDotfiles)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, n := range names {
		fi, err := os.Stat(n)
		if err != nil {
			return "", err
		}
		real, err := filepath.EvalSymlinks(n)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s\x00%s\x00%d\x00%d\x00", n, real, fi.Size(), fi.ModTime().UnixNano())
	}
	return b.String(), nil
}
