// Command drip is the rate limiter's command line: serve, replay,
// simulate, check, pg and version.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"

	_ "time/tzdata" // calendar periods' time zones, also in an empty root (the container)
)

// version, when set at build time with -ldflags "-X main.version=...",
// replaces the module version read from the build info.
var version = ""

type command struct {
	name  string
	brief string
	run   func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int
}

// commands lists the subcommands; each file of this package adds its own.
var commands []command

func register(c command) { commands = append(commands, c) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	asRatelimit = isRatelimit(os.Args)
	code := run(ctx, argsOf(os.Args), os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// argsOf is the command line of argv: its arguments, or, for a binary
// called ratelimit (the image's /bin/ratelimit, the command Envoy
// Gateway's Deployment runs), drip serve --listen off with them:
// envoyproxy/ratelimit, which has no decision API, started with its
// environment (docs/envoy.md).
func argsOf(argv []string) []string {
	if isRatelimit(argv) {
		return append([]string{"serve", "--listen", "off"}, argv[1:]...)
	}
	return argv[1:]
}

// asRatelimit is set when drip runs as ratelimit: drip serve then takes
// envoyproxy/ratelimit's listeners (serve_envoy.go).
var asRatelimit bool

func isRatelimit(argv []string) bool { return len(argv) > 0 && filepath.Base(argv[0]) == "ratelimit" }

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		if len(args) > 1 && args[0] == "help" { // drip help serve = drip serve -h
			return run(ctx, []string{args[1], "-h"}, stdin, stdout, stderr)
		}
		usage(stdout)
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdin, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "drip: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: drip <command> [flags]\n\ndrip is a rate limiter: a Go library, net/http middleware and this server.\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.brief)
	}
	fmt.Fprintln(w, "\nRun 'drip <command> -h' for a command's usage, flags and examples.")
	fmt.Fprintln(w, "Start with: drip serve")
}

func init() {
	register(command{name: "version", brief: "print drip's version and VCS revision", run: runVersion})
}

func runVersion(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("version")
	if code, done := parseFlags(fs, versionUsage, args, stdout, stderr); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "drip version: unexpected arguments %q\n", fs.Args())
		return 2
	}
	info, _ := debug.ReadBuildInfo()
	fmt.Fprintln(stdout, versionLine(info, version))
	return 0
}

// versionLine describes a build: "drip v1.2.3" for a released module,
// "drip v0.0.0-20261123231453-0123abcdef01 rev 0123abcdef01" for a build
// from a clone, "drip (devel)" for one that recorded no VCS information.
// override, when set (-ldflags -X main.version=...), replaces the module
// version.
func versionLine(info *debug.BuildInfo, override string) string {
	v := "(devel)"
	settings := map[string]string{}
	if info != nil {
		if info.Main.Version != "" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			settings[s.Key] = s.Value
		}
	}
	if override != "" {
		v = override
	}
	line := "drip " + v
	if rev := settings["vcs.revision"]; rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		line += " rev " + rev
		if settings["vcs.modified"] == "true" {
			line += " (modified)"
		}
	}
	return line
}
