package sdk

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/examples/llm/upstream"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/server"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/store/redisstore"
)

const (
	rulesFile = "../rules.yaml"
	secret    = "a secret of at least thirty-two bytes, for hashed keys"
	day       = 200000.0 // the strict day of rules.yaml
)

// frozen decides at one instant, so that the test counts tokens exactly.
type frozen struct {
	store.Store
	at time.Time
}

func (f frozen) Apply(ctx context.Context, op bucket.Op, _ time.Time, items []bucket.Prepared, results []bucket.Result) error {
	return f.Store.Apply(ctx, op, f.at, items, results)
}

// gateway is drip serve (its server package, as the command runs it)
// with --upstream in front of the stand-in and examples/llm/rules.yaml.
type gateway struct {
	base string
	st   store.Store
	set  *rules.Set
	hits atomic.Int64 // requests the SDKs sent
}

func start(t *testing.T, st store.Store) *gateway {
	t.Setenv("DRIP_KEY_SECRET", secret)
	up := httptest.NewServer(upstream.New())
	t.Cleanup(up.Close)
	set, err := rules.Load(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	st = frozen{st, time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	srv, err := server.New(server.Config{Rules: rulesFile, Upstream: up.URL, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		WatchEvery: -1, Drain: -1, StoreTimeout: 30 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &gateway{base: "http://" + srv.Addr().String(), st: st, set: set}
}

// client counts the requests an SDK sends.
func (g *gateway) client() *http.Client {
	return &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		g.hits.Add(1)
		return http.DefaultTransport.RoundTrip(r)
	})}
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// waitLeft waits until rule's bucket of the API key holds want (the
// settlement follows the response's end).
func (g *gateway) waitLeft(t *testing.T, rule, apiKey string, want float64) {
	t.Helper()
	r, _ := g.set.Rule(rule)
	vals, _ := r.KeyValues(func(rules.Source) (string, bool) { return apiKey, true })
	var got float64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		m, err := drip.Apply(context.Background(), g.st, bucket.Peek, time.Time{}, drip.Request{Key: r.Key(vals), Limit: r.Limit})
		if err != nil {
			t.Fatal(err)
		}
		if got = m.Decisions[0].Tokens; got == want {
			return
		}
	}
	t.Fatalf("%s: %v left, want %v", rule, got, want)
}

// stores are the stores the SDKs are driven on: memory, and a
// PostgreSQL and a Redis server the test starts.
func stores(t *testing.T) map[string]func(*testing.T) store.Store {
	return map[string]func(*testing.T) store.Store{
		"memory": func(t *testing.T) store.Store {
			s := memstore.New()
			t.Cleanup(func() { s.Close() })
			return s
		},
		"postgres": func(t *testing.T) store.Store {
			s, err := pgstore.Open(context.Background(), startPostgres(t)+"&drip_install=true")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		"redis": func(t *testing.T) store.Store {
			s, err := redisstore.Open(startRedis(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
	}
}

// startRedis starts a throwaway redis-server on a free loopback port;
// without one the test is skipped, or fails under CI=true.
func startRedis(t *testing.T) string {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not on PATH")
		}
		t.Skip("test dependency missing: redis-server")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err == nil {
			c.Close()
			return "redis://127.0.0.1:" + port
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not start: %v", err)
		}
	}
}

// missing skips the test, or fails it under CI=true.
func missing(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal("test dependency missing: " + what)
	}
	t.Skip("test dependency missing: " + what)
}

// pgBinDir finds initdb, postgres and pg_isready: on PATH, in PG_BINDIR, in
// pg_config --bindir, or in Debian's /usr/lib/postgresql/<version>/bin.
func pgBinDir() string {
	dirs := []string{os.Getenv("PG_BINDIR")}
	if bin, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(bin))
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	debian, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for _, d := range append(dirs, debian...) {
		_, e1 := os.Stat(filepath.Join(d, "initdb"))
		_, e2 := os.Stat(filepath.Join(d, "postgres"))
		_, e3 := os.Stat(filepath.Join(d, "pg_isready"))
		if d != "" && e1 == nil && e2 == nil && e3 == nil {
			return d
		}
	}
	return ""
}

// startPostgres initializes and starts a throwaway PostgreSQL server
// (fsync off, its Unix socket in its own directory) on a free loopback
// port, stopped when the test ends, and returns its URL. PostgreSQL
// refuses to run as root, so as root it runs as the postgres user.
func startPostgres(t *testing.T) string {
	bin := pgBinDir()
	if bin == "" {
		missing(t, "PostgreSQL's initdb and postgres (install postgresql or set PG_BINDIR)")
	}
	// Under os.TempDir, not t.TempDir (whose parents may be 0700): the
	// postgres user must reach it.
	dir, err := os.MkdirTemp("", "drip-sdk-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	attr := &syscall.SysProcAttr{}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			missing(t, "a postgres user to run PostgreSQL as (the test runs as root)")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = attr
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	var out strings.Builder
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", port, "-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+dir, "-c", "fsync=off", "-c", "full_page_writes=off")
	cmd.SysProcAttr, cmd.Stdout, cmd.Stderr = attr, &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	url := "postgres://postgres@127.0.0.1:" + port + "/postgres?sslmode=disable"
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		select {
		case <-exited:
			t.Fatalf("postgres exited at start:\n%s", out.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := exec.CommandContext(ctx, filepath.Join(bin, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", port, "-U", "postgres").Run()
		cancel()
		if err == nil {
			return url
		}
		if time.Now().After(deadline) {
			t.Fatalf("postgres did not start: %v", err)
		}
	}
}

// TestOpenAISDK: openai-go through the gateway, not streamed and
// streamed: each call is charged the usage the stand-in reports (a
// stream's usage, which drip asks for on the SDK's behalf), and a call
// that can never pass is a 429 the SDK reads as rate_limit_exceeded and
// does not retry.
func TestOpenAISDK(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			g := start(t, open(t))
			const key = "sk-openai-sdk"
			c := openai.NewClient(option.WithBaseURL(g.base+"/v1/"), option.WithAPIKey(key), option.WithHTTPClient(g.client()))
			ctx := context.Background()
			msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}

			res, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "m", Messages: msgs, MaxCompletionTokens: openai.Int(50)})
			if err != nil {
				t.Fatal(err)
			}
			if res.Usage.TotalTokens != 30 || res.Choices[0].Message.Content == "" {
				t.Fatalf("%+v", res)
			}
			g.waitLeft(t, "openai-day", key, day-30)

			stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "m", Messages: msgs, MaxTokens: openai.Int(50)},
				option.WithHeader("X-Test-Completion-Tokens", "7"))
			var acc openai.ChatCompletionAccumulator
			for stream.Next() {
				acc.AddChunk(stream.Current())
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if acc.Usage.TotalTokens != 17 || acc.Choices[0].Message.Content != "tok tok tok tok tok tok tok " {
				t.Fatalf("streamed: usage %+v, %q", acc.Usage, acc.Choices[0].Message.Content)
			}
			g.waitLeft(t, "openai-day", key, day-30-17)

			g.hits.Store(0)
			_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "m", Messages: msgs, MaxCompletionTokens: openai.Int(300000)},
				option.WithMaxRetries(3))
			var aerr *openai.Error
			if !errors.As(err, &aerr) || aerr.StatusCode != 429 || aerr.Code != "rate_limit_exceeded" || aerr.Type != "tokens" {
				t.Fatalf("over the burst: %v", err)
			}
			if n := g.hits.Load(); n != 1 {
				t.Errorf("the SDK sent a call that can never pass %d times", n)
			}
		})
	}
}

// TestOpenAIResponsesSDK: openai-go's Responses API through the
// gateway, not streamed and streamed (the usage in response.completed).
func TestOpenAIResponsesSDK(t *testing.T) {
	g := start(t, memstore.New())
	const key = "sk-responses-sdk"
	c := openai.NewClient(option.WithBaseURL(g.base+"/v1/"), option.WithAPIKey(key), option.WithHTTPClient(g.client()))
	ctx := context.Background()
	params := responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
		MaxOutputTokens: openai.Int(50)}
	res, err := c.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if res.Usage.TotalTokens != 30 || res.OutputText() == "" {
		t.Fatalf("%+v", res.Usage)
	}
	g.waitLeft(t, "openai-day", key, day-30)

	stream := c.Responses.NewStreaming(ctx, params, option.WithHeader("X-Test-Completion-Tokens", "4"))
	var total int64
	for stream.Next() {
		if ev := stream.Current(); ev.Type == "response.completed" {
			total = ev.Response.Usage.TotalTokens
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if total != 14 {
		t.Fatalf("streamed: %d tokens", total)
	}
	g.waitLeft(t, "openai-day", key, day-30-14)
}

// TestAnthropicSDK: anthropic-sdk-go through the gateway, not streamed
// and streamed (message_start and message_delta), and its 429.
func TestAnthropicSDK(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			g := start(t, open(t))
			const key = "sk-ant-sdk"
			c := anthropic.NewClient(aoption.WithBaseURL(g.base), aoption.WithAPIKey(key), aoption.WithHTTPClient(g.client()))
			ctx := context.Background()
			params := anthropic.MessageNewParams{Model: "c", MaxTokens: 64,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}

			msg, err := c.Messages.New(ctx, params)
			if err != nil {
				t.Fatal(err)
			}
			if msg.Usage.InputTokens != 10 || msg.Usage.OutputTokens != 20 {
				t.Fatalf("%+v", msg.Usage)
			}
			g.waitLeft(t, "anthropic-day", key, day-30)

			stream := c.Messages.NewStreaming(ctx, params, aoption.WithHeader("X-Test-Completion-Tokens", "5"), aoption.WithHeader("X-Test-Prompt-Tokens", "12"))
			var acc anthropic.Message
			for stream.Next() {
				if err := acc.Accumulate(stream.Current()); err != nil {
					t.Fatal(err)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if acc.Usage.InputTokens != 12 || acc.Usage.OutputTokens != 5 {
				t.Fatalf("streamed: %+v", acc.Usage)
			}
			g.waitLeft(t, "anthropic-day", key, day-30-17)

			g.hits.Store(0)
			params.MaxTokens = 300000 // streamed: the SDK refuses to wait for so many otherwise
			over := c.Messages.NewStreaming(ctx, params, aoption.WithMaxRetries(3))
			for over.Next() {
			}
			err = over.Err()
			var aerr *anthropic.Error
			if !errors.As(err, &aerr) || aerr.StatusCode != 429 || aerr.Type() != "rate_limit_error" {
				t.Fatalf("over the burst: %v", err)
			}
			if n := g.hits.Load(); n != 1 {
				t.Errorf("the SDK sent a call that can never pass %d times", n)
			}
		})
	}
}
