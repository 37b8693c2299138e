package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"

	"github.com/driplimit/drip/replay"
)

func init() {
	register(command{name: "replay", brief: "run JSON-lines requests on a store in virtual time", run: runReplay})
}

func runReplay(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("replay")
	storeURL := fs.String("store", envOr("DRIP_STORE", "memory"), "store: memory, postgres://..., redis://..., rediss://..., redis+sentinel://... (env DRIP_STORE)")
	prefix := fs.String("prefix", "", "key prefix (default: fresh and random per run)")
	if code, done := parseFlags(fs, replayUsage, args, stdout, stderr); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "drip replay: unexpected arguments %q (requests come on stdin)\n", fs.Args())
		return 2
	}
	if *prefix == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		*prefix = "replay:" + hex.EncodeToString(b[:]) + ":"
	}
	store, closeStore, err := openStore(ctx, *storeURL)
	if err != nil {
		fmt.Fprintln(stderr, "drip replay:", err)
		return 1
	}
	defer closeStore()
	if err := replay.Run(ctx, store, *prefix, stdin, stdout); err != nil {
		fmt.Fprintln(stderr, "drip replay:", err)
		return 1
	}
	return 0
}
