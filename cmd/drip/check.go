package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/driplimit/drip/rules"
)

func init() {
	register(command{name: "check", brief: "validate rules files and envoyproxy/ratelimit configs (files or directories)", run: runCheck})
}

// runCheck loads each file with the loader drip serve uses. It prints
// every problem of a bad file, one per line as "file: path: message", and
// exits 1 if any file is bad, 2 on a usage error.
func runCheck(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("check")
	if code, done := parseFlags(fs, checkUsage, args, stdout, stderr); done {
		return code
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stderr, checkUsage)
		return 2
	}
	code := 0
	for _, path := range fs.Args() {
		if handled, bad := checkEnvoy(path, stdout, stderr); handled { // check_envoy.go
			if bad {
				code = 1
			}
			continue
		}
		set, err := rules.Load(path)
		if err != nil {
			code = 1
			var re *rules.Error
			if errors.As(err, &re) {
				fmt.Fprintln(stderr, re.Error())
				fmt.Fprintf(stderr, "%s: %d problem(s)\n", path, len(re.Problems))
			} else {
				fmt.Fprintf(stderr, "%s: %v\n", path, err)
			}
			continue
		}
		fmt.Fprintf(stdout, "%s: ok, %d rule(s)\n", path, len(set.Rules))
	}
	return code
}
