package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/server/envoy"
)

// checkEnvoy checks path when it is an envoyproxy/ratelimit config file
// (a top-level "domain" or "descriptors") or a directory, as drip serve
// --rules loads them (with envoyproxy/ratelimit's environment variables):
// every envoy file of it together (domains must not repeat), any drip
// rules file with rules.Load. It reports whether path was such a path, and
// whether it was bad.
func checkEnvoy(path string, stdout, stderr io.Writer) (handled, bad bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return false, false
	}
	if !fi.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil || !envoy.IsConfig(data) {
			return false, false
		}
	}
	opts, err := envoy.OptionsFromEnv(os.Getenv) // as drip serve loads the files
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", path, err)
		return true, true
	}
	names, err := envoy.ConfigFilesWith(path, !opts.IgnoreDotfiles)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", path, err)
		return true, true
	}
	var files []envoy.File
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", n, err)
			bad = true
			continue
		}
		if envoy.IsConfig(data) {
			files = append(files, envoy.File{Name: n, Data: data})
			continue
		}
		if n != path && envoy.IsDotfile(n) {
			continue // a directory's dotfiles count only when they are envoy files
		}
		set, err := rules.ParseEnv(data, n, rules.OSEnv)
		if err != nil {
			bad = true
			var re *rules.Error
			if errors.As(err, &re) {
				fmt.Fprintln(stderr, re.Error())
			} else {
				fmt.Fprintf(stderr, "%s: %v\n", n, err)
			}
			continue
		}
		fmt.Fprintf(stdout, "%s: ok, %d rule(s)\n", n, len(set.Rules))
	}
	if len(files) == 0 {
		return true, bad
	}
	cfg, err := envoy.ParseWith(opts, files...)
	if err != nil {
		var re *rules.Error
		if errors.As(err, &re) {
			fmt.Fprintln(stderr, re.Error())
			fmt.Fprintf(stderr, "%s: %d problem(s)\n", path, len(re.Problems))
		} else {
			fmt.Fprintf(stderr, "%s: %v\n", path, err)
		}
		return true, true
	}
	fmt.Fprintf(stdout, "%s: ok, envoyproxy/ratelimit config of %d domain(s) in %d file(s)\n", path, len(cfg.Domains()), len(files))
	return true, bad
}
