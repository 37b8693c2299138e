package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/storetest"
)

// TestReplayRedis runs drip replay --store redis://... on every trace of
// storetest, on one server, on a cluster and through Sentinel
// (redis+sentinel://), and compares with the golden output, which the
// memory store produces.
func TestReplayRedis(t *testing.T) {
	urls := map[string]string{
		"single":   testserver.SharedRedisURL(t),
		"cluster":  testserver.SharedRedisClusterURL(t),
		"sentinel": testserver.StartRedisSentinel(t).URL(),
	}
	for kind, url := range urls {
		for _, name := range storetest.TraceNames() {
			in, golden := storetest.ReadTrace(name)
			// Multi-takes span keys: on a cluster, a hash tag in the
			// prefix keeps a trace's keys in one slot.
			args := []string{"replay", "--store", url}
			if kind == "cluster" {
				args = append(args, "--prefix", "replay:{"+name+"}:")
			}
			var out, errb bytes.Buffer
			code := run(context.Background(), args, strings.NewReader(strings.Join(in, "\n")), &out, &errb)
			if code != 0 {
				t.Fatalf("%s %s: exit %d: %s", kind, name, code, errb.String())
			}
			got := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(got) != len(golden) {
				t.Fatalf("%s %s: %d lines, want %d", kind, name, len(got), len(golden))
			}
			for i := range got {
				if !storetest.SameLine(got[i], golden[i]) {
					t.Errorf("%s %s line %d:\n got  %s\n want %s", kind, name, i+1, got[i], golden[i])
				}
			}
		}
	}
}
