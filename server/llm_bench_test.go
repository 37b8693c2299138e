package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	llm "github.com/driplimit/drip/examples/llm/upstream"
	"github.com/driplimit/drip/store/memstore"
)

// llmBenchRules are the example's kinds of rule (a strict day and a soft
// minute that read OpenAI's usage, keyed by the hashed API key, beside a
// request rule) with limits a benchmark does not reach.
const llmBenchRules = `key_secret_env: DRIP_KEY_SECRET
rules:
  - name: day
    limit_keys: ["hash:api_key"]
    budget: strict
    cost_from_response: openai
    algorithm: fixed_window
    algorithm_config: {rate: 1e12, period: day, time_zone: UTC, cost_source: openai, min_cost: 10}
  - name: minute
    limit_keys: ["hash:api_key"]
    cost_from_response: openai
    algorithm_config: {rate: 1e12, period: 1m, cost_source: openai, min_cost: 10}
  - name: requests
    limit_keys: ["hash:api_key"]
    algorithm_config: {rate: 1e9, period: 1m}
`

// llmBenchTargets returns the stand-in's URL and drip's gateway in front
// of it with llmBenchRules.
func llmBenchTargets(b *testing.B) (direct, gateway string) {
	b.Setenv("DRIP_KEY_SECRET", llmSecret)
	up := httptest.NewServer(llm.New())
	b.Cleanup(up.Close)
	file := filepath.Join(b.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte(llmBenchRules), 0o600); err != nil {
		b.Fatal(err)
	}
	srv := start(b, Config{Rules: file, Upstream: up.URL, WatchEvery: -1}, memstore.New())
	return up.URL, srv.base
}

// BenchmarkLLMStream streams a chat completion of 256 tokens (about 50
// KB of server-sent events) straight from the stand-in and through drip's
// gateway, which reserves its bound, reads its usage as it streams by
// and settles: ttfb-µs is the median time to the first event, MB/s the
// stream's throughput.
func BenchmarkLLMStream(b *testing.B) {
	direct, gateway := llmBenchTargets(b)
	body := `{"model":"m","stream":true,"max_tokens":256,"messages":[{"role":"user","content":"hi"}]}`
	for _, t := range []struct{ name, base string }{{"direct", direct}, {"gateway", gateway}} {
		b.Run(t.name, func(b *testing.B) {
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			var ttfb []time.Duration
			var bytes int64
			for b.Loop() {
				start := time.Now()
				req, _ := http.NewRequest("POST", t.base+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer sk-bench")
				req.Header.Set("X-Test-Completion-Tokens", "256")
				res, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				br := bufio.NewReader(res.Body)
				line, err := br.ReadString('\n')
				if err != nil || !strings.HasPrefix(line, "data: ") {
					b.Fatalf("%d %q %v", res.StatusCode, line, err)
				}
				ttfb = append(ttfb, time.Since(start))
				n, _ := io.Copy(io.Discard, br)
				bytes += n + int64(len(line))
				res.Body.Close()
			}
			slices.Sort(ttfb)
			b.ReportMetric(float64(ttfb[len(ttfb)/2].Microseconds()), "ttfb-µs")
			b.SetBytes(bytes / int64(b.N))
		})
	}
}

// BenchmarkLLMOpenStreams holds 256 streams open at once (the stand-in
// waits after its first token until the client goes away), straight and
// through the gateway: heap-KiB/stream is the heap in use per open
// stream, of the whole process (client, stand-in, and the gateway when it
// is in the path), pooled buffers included; the gateway's own share is
// the difference.
func BenchmarkLLMOpenStreams(b *testing.B) {
	direct, gateway := llmBenchTargets(b)
	body := `{"model":"m","stream":true,"max_tokens":256,"messages":[{"role":"user","content":"hi"}]}`
	const n = 256
	for _, t := range []struct{ name, base string }{{"direct", direct}, {"gateway", gateway}} {
		b.Run(t.name, func(b *testing.B) {
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: 0}}
			var perStream float64
			for b.Loop() {
				// Twice: the first GC moves pooled buffers (the proxy's
				// copy buffers) to the pools' victim caches, the second
				// frees them, so that each stream's buffer is counted.
				runtime.GC()
				runtime.GC()
				var before runtime.MemStats
				runtime.ReadMemStats(&before)
				ctx, cancel := context.WithCancel(context.Background())
				var bodies []io.ReadCloser
				for i := range n {
					req, _ := http.NewRequestWithContext(ctx, "POST", t.base+"/v1/chat/completions", strings.NewReader(body))
					req.Header.Set("Authorization", fmt.Sprintf("Bearer sk-open-%d", i))
					req.Header.Set("X-Test-Hold", "1")
					res, err := c.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := bufio.NewReader(res.Body).ReadString('\n'); err != nil {
						b.Fatal(err)
					}
					bodies = append(bodies, res.Body)
				}
				runtime.GC()
				var during runtime.MemStats
				runtime.ReadMemStats(&during)
				perStream = float64(int64(during.HeapInuse)-int64(before.HeapInuse)) / n / 1024
				cancel()
				for _, rb := range bodies {
					rb.Close()
				}
			}
			b.ReportMetric(perStream, "heap-KiB/stream")
		})
	}
}
