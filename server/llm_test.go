package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	llm "github.com/driplimit/drip/examples/llm/upstream"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// frozen is a store whose every decision is at one instant: the buckets
// of the example refill by the second, and the test counts tokens exactly.
type frozen struct {
	store.Store
	at time.Time
}

func (f frozen) Apply(ctx context.Context, op bucket.Op, _ time.Time, items []bucket.Prepared, results []bucket.Result) error {
	return f.Store.Apply(ctx, op, f.at, items, results)
}

const llmSecret = "a secret of at least thirty-two bytes, for hashed keys"

// llmEnv is drip serve with examples/llm/rules.yaml in front of the
// stand-in upstream, on one store at a frozen instant.
type llmEnv struct {
	set  *rules.Set
	st   store.Store
	srv  *running
	up   *llm.Server
	upTS *httptest.Server
}

func newLLMEnv(t *testing.T, st store.Store, file string) *llmEnv {
	t.Setenv("DRIP_KEY_SECRET", llmSecret)
	up := llm.New()
	upTS := httptest.NewServer(up)
	t.Cleanup(upTS.Close)
	set, err := rules.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	st = frozen{st, time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	srv := start(t, Config{Rules: file, Upstream: upTS.URL, WatchEvery: -1, AdminToken: adminToken}, st)
	return &llmEnv{set, st, srv, up, upTS}
}

// left is what rule's bucket of the API key holds.
func (e *llmEnv) left(t *testing.T, rule, apiKey string) float64 {
	t.Helper()
	r, ok := e.set.Rule(rule)
	if !ok {
		t.Fatalf("no rule %s", rule)
	}
	vals, _ := r.KeyValues(func(rules.Source) (string, bool) { return apiKey, true })
	if strings.Contains(r.Key(vals), apiKey) {
		t.Fatalf("the bucket key %q holds the API key", r.Key(vals))
	}
	m, err := drip.Apply(context.Background(), e.st, bucket.Peek, time.Time{}, drip.Request{Key: r.Key(vals), Limit: r.Limit})
	if err != nil {
		t.Fatal(err)
	}
	return m.Decisions[0].Tokens
}

// waitEvent waits until the metrics count n events of rule.
func (e *llmEnv) waitEvent(t *testing.T, rule, event string, n float64) {
	t.Helper()
	key := `drip_decisions_total{mode=enforce,outcome=` + event + `,rule=` + rule + `}`
	for deadline := time.Now().Add(30 * time.Second); scrape(t, e.srv.admin)[key] < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached %v", key, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// call posts body to path with the API key (a bearer token for OpenAI's
// path, x-api-key for Anthropic's; as is when it says "Bearer ") and
// headers.
func (e *llmEnv) call(t *testing.T, ctx context.Context, path, apiKey, body string, headers ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	switch {
	case strings.HasPrefix(apiKey, "Bearer "):
		req.Header.Set("Authorization", apiKey)
	case path == "/v1/messages":
		req.Header.Set("X-Api-Key", apiKey)
	default:
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// waitSettled waits until every call rule allowed has settled: its
// bucket is then as the metrics say.
func (e *llmEnv) waitSettled(t *testing.T, rule string) {
	t.Helper()
	allowed := scrape(t, e.srv.admin)[`drip_decisions_total{mode=enforce,outcome=allowed,rule=`+rule+`}`]
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m := scrape(t, e.srv.admin)
		n := 0.0
		for _, ev := range []string{"charged", "refunded", "forgiven", "settled", "unreported"} {
			n += m[`drip_decisions_total{mode=enforce,outcome=`+ev+`,rule=`+rule+`}`]
		}
		if n >= allowed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v of %v settled", n, allowed)
		}
	}
}

// storm runs 64 clients of 8 streamed calls each with the API key, the
// bodies body makes, and the stand-in told to generate up to 600 tokens,
// report at most the body's length of input, fail one call in six and
// cut one stream in six; one client in five goes away mid-stream. It
// returns the count of each status.
func (e *llmEnv) storm(t *testing.T, seed uint64, apiKey string, body func(*rand.Rand) string, headers ...string) map[int]int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	status := map[int]int{}
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), seed))
			for range 8 {
				b := body(rng)
				hs := append([]string{"X-Test-Completion-Tokens", strconv.Itoa(rng.IntN(600)),
					"X-Test-Prompt-Tokens", strconv.Itoa(rng.IntN(len(b)))}, headers...)
				switch rng.IntN(6) {
				case 0:
					hs = append(hs, "X-Test-Fail", "500")
				case 1:
					hs = append(hs, "X-Test-Cut", strconv.Itoa(rng.IntN(50)))
				}
				code := e.stream(t, rng, apiKey, b, hs...)
				mu.Lock()
				status[code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return status
}

// stream posts body to Chat Completions with the API key and headers,
// and reads the answer whole, or one line of it (a client gone
// mid-stream) one time in five; it returns the status.
func (e *llmEnv) stream(t *testing.T, rng *rand.Rand, apiKey, body string, headers ...string) int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := e.call(t, ctx, "/v1/chat/completions", apiKey, body, headers...)
	if rng.IntN(5) == 0 {
		bufio.NewReader(res.Body).ReadString('\n')
		cancel()
	} else {
		io.Copy(io.Discard, res.Body)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestLLMExample runs examples/llm on memory, PostgreSQL and Redis: drip
// serve's gateway with its rules in front of the stand-in upstream, which
// reports usage only in its bodies, as OpenAI and Anthropic do. A strict
// day takes the call's bound (its body's bytes plus max_tokens) and keeps
// what the usage says; a stream that did not ask for its usage is made
// to; a client gone mid-stream keeps its bound (unreported); an upstream
// error costs min_cost; a call with no max_tokens is refused, taking
// nothing.
func TestLLMExample(t *testing.T) {
	for _, name := range []string{"memory", "postgres", "redis"} {
		t.Run(name, func(t *testing.T) {
			e := newLLMEnv(t, teststores.Open(t, name), "../examples/llm/rules.yaml")
			const key = "sk-test-a"
			const day = 200000.0

			// Not streamed: the usage in the body, 10 + 20.
			body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`
			res := e.call(t, context.Background(), "/v1/chat/completions", key, body)
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 || !strings.Contains(string(b), `"total_tokens":30`) {
				t.Fatalf("%d %s", res.StatusCode, b)
			}
			e.waitEvent(t, "openai-day", "refunded", 1)
			if got := e.left(t, "openai-day", key); got != day-30 {
				t.Errorf("after a call of 30 tokens: %v left", got)
			}

			// Streamed without stream_options: drip asks for the usage.
			body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":50}`
			res = e.call(t, context.Background(), "/v1/chat/completions", key, body, "X-Test-Completion-Tokens", "7")
			b, _ = io.ReadAll(res.Body)
			res.Body.Close()
			if !strings.Contains(string(b), `"usage":{"completion_tokens":7`) || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				t.Fatalf("%s", b)
			}
			e.waitEvent(t, "openai-day", "refunded", 2)
			if got := e.left(t, "openai-day", key); got != day-30-17 {
				t.Errorf("after 17 more: %v left", got)
			}

			// Anthropic, streamed: input + output tokens.
			body = `{"model":"c","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
			res = e.call(t, context.Background(), "/v1/messages", "sk-ant-a", body, "X-Test-Prompt-Tokens", "12", "X-Test-Completion-Tokens", "5")
			b, _ = io.ReadAll(res.Body)
			res.Body.Close()
			if !strings.Contains(string(b), "event: message_delta") {
				t.Fatalf("%s", b)
			}
			e.waitEvent(t, "anthropic-day", "refunded", 1)
			if got := e.left(t, "anthropic-day", "sk-ant-a"); got != day-17 {
				t.Errorf("anthropic, after 17: %v left", got)
			}

			// A client gone mid-stream: its bound stands, reported as such.
			body = `{"model":"m","stream":true,"messages":[],"max_tokens":1000}`
			ctx, cancel := context.WithCancel(context.Background())
			res = e.call(t, ctx, "/v1/chat/completions", "sk-test-b", body, "X-Test-Hold", "1")
			if line, err := bufio.NewReader(res.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
				t.Fatalf("%q %v", line, err)
			}
			cancel()
			res.Body.Close()
			e.waitEvent(t, "openai-day", "unreported", 1)
			if got := e.left(t, "openai-day", "sk-test-b"); got != day-float64(len(body)+1000) {
				t.Errorf("client gone: %v left, want the bound %d taken", got, len(body)+1000)
			}

			// An upstream error: min_cost.
			res = e.call(t, context.Background(), "/v1/chat/completions", "sk-test-c", `{"max_tokens":10}`, "X-Test-Fail", "500")
			res.Body.Close()
			if res.StatusCode != 500 {
				t.Fatalf("upstream error: %d", res.StatusCode)
			}
			e.waitEvent(t, "openai-day", "refunded", 3)
			if got := e.left(t, "openai-day", "sk-test-c"); got != day-10 {
				t.Errorf("upstream error: %v left, want min_cost taken", got)
			}

			// No max_tokens under a strict budget: refused, nothing taken.
			res = e.call(t, context.Background(), "/v1/chat/completions", "sk-test-d", `{"messages":[]}`)
			b, _ = io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 400 || !strings.Contains(string(b), "unbounded_request") {
				t.Errorf("unbounded: %d %s", res.StatusCode, b)
			}
			if got := e.left(t, "requests-minute", "sk-test-d"); got != 60 {
				t.Errorf("unbounded: the request rule has %v left", got)
			}
		})
	}
}

// TestLLMStrictNeverExceeded: 64 clients stream at once against a strict
// budget of 20,000 tokens a day on one API key, with random aborts,
// upstream errors (at once and mid-stream), and bodies whose max_tokens
// is repeated or larger than what they say elsewhere. Every token the
// upstream spent (inputs and every token generated, reported or not) is
// within the budget; the soft minute beside it stays within its debt
// bound.
func TestLLMStrictNeverExceeded(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, file, `key_secret_env: DRIP_KEY_SECRET
rules:
  - name: day
    limit_keys: ["hash:header:authorization"]
    budget: strict
    cost_from_response: openai
    algorithm: fixed_window
    algorithm_config: {rate: 20000, period: day, time_zone: Europe/Paris, cost_source: openai, min_cost: 5}
  - name: minute
    limit_keys: ["hash:header:authorization"]
    cost_from_response: openai
    algorithm: token_bucket
    algorithm_config: {rate: 15000, period: 1m, cost_source: header:x-estimate, default_cost: 50, min_cost: 5}
`)
	e := newLLMEnv(t, memstore.New(), file)
	const key = "Bearer sk-many"
	status := e.storm(t, 7, key, func(rng *rand.Rand) string {
		maxTok := 1 + rng.IntN(400)
		if rng.IntN(4) == 0 { // says a small max_tokens, then a larger one
			return fmt.Sprintf(`{"max_tokens":1,"stream":true,"max_tokens":%d}`, maxTok)
		}
		return fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"%s"}]}`, maxTok, strings.Repeat("x", rng.IntN(200)))
	}, "X-Estimate", "0")
	e.waitSettled(t, "day")
	spent := e.up.Spent()
	left := e.left(t, "day", key)
	t.Logf("statuses %v; the upstream spent %d tokens; %v left of the day", status, spent, left)
	if spent > 20000 || left < 0 {
		t.Errorf("the strict day was exceeded: the upstream spent %d tokens of 20,000 (%v left)", spent, left)
	}
	// The spend the metrics show is what the day's bucket counts.
	if got := scrape(t, e.srv.admin)[`drip_spent_tokens_total{rule=day}`]; got != 20000-left {
		t.Errorf("drip_spent_tokens_total of the day: %v, want %v", got, 20000-left)
	}
	if status[429] == 0 || status[200] == 0 {
		t.Errorf("statuses %v: the budget was never reached", status)
	}
	if m := e.left(t, "minute", key); m < -15000 {
		t.Errorf("the soft minute is %v: past its debt bound of one burst", m)
	}
}

// TestLLMAnswersAsTheAPIs: behind rules that read OpenAI's or
// Anthropic's API, answers carry that API's rate limit headers beside
// the RateLimit ones, and a denial is that API's error body: a 429 that
// can pass later with Retry-After and Retry-After-Ms, one that never can
// with x-should-retry: false, a call a strict budget cannot bound a 400.
func TestLLMAnswersAsTheAPIs(t *testing.T) {
	e := newLLMEnv(t, memstore.New(), "../examples/llm/rules.yaml")
	read := func(res *http.Response) string {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return string(b)
	}
	// Allowed: the headers of each API.
	res := e.call(t, context.Background(), "/v1/chat/completions", "sk-h", `{"max_tokens":5}`)
	read(res)
	h := res.Header
	if h.Get("X-Ratelimit-Limit-Requests") != "60" || h.Get("X-Ratelimit-Remaining-Requests") != "59" ||
		h.Get("X-Ratelimit-Limit-Tokens") != "20000" || h.Get("RateLimit-Policy") == "" {
		t.Errorf("openai headers: %v", h)
	}
	for _, k := range []string{"X-Ratelimit-Reset-Requests", "X-Ratelimit-Reset-Tokens"} {
		if _, err := time.ParseDuration(h.Get(k)); err != nil {
			t.Errorf("%s: %q", k, h.Get(k))
		}
	}
	res = e.call(t, context.Background(), "/v1/messages", "sk-ant-h", `{"max_tokens":5}`)
	read(res)
	h = res.Header
	if h.Get("Anthropic-Ratelimit-Requests-Limit") != "60" || h.Get("Anthropic-Ratelimit-Tokens-Remaining") == "" || h.Get("X-Ratelimit-Limit-Requests") != "" {
		t.Errorf("anthropic headers: %v", h)
	}
	if _, err := time.Parse(time.RFC3339, h.Get("Anthropic-Ratelimit-Tokens-Reset")); err != nil {
		t.Errorf("anthropic reset: %v", err)
	}

	// Over the burst: can never pass.
	res = e.call(t, context.Background(), "/v1/chat/completions", "sk-h", `{"max_tokens":300000}`)
	body := read(res)
	if res.StatusCode != 429 || res.Header.Get("X-Should-Retry") != "false" ||
		!strings.Contains(body, `"code":"rate_limit_exceeded"`) || !strings.Contains(body, `"type":"tokens"`) || !strings.HasPrefix(body, `{"error":{`) {
		t.Errorf("over the burst: %d %v %s", res.StatusCode, res.Header, body)
	}
	// A minute used up by a stream that holds its bound: 429, retry later.
	ctx, cancel := context.WithCancel(context.Background())
	res = e.call(t, ctx, "/v1/messages", "sk-ant-h", `{"max_tokens":19900,"stream":true}`, "X-Test-Hold", "1")
	if line, err := bufio.NewReader(res.Body).ReadString('\n'); res.StatusCode != 200 || err != nil {
		t.Fatalf("the stream: %d %q %v", res.StatusCode, line, err)
	}
	cancel()
	res.Body.Close()
	e.waitEvent(t, "anthropic-minute", "unreported", 1)
	res = e.call(t, context.Background(), "/v1/messages", "sk-ant-h", `{"max_tokens":500}`)
	body = read(res)
	ra, _ := strconv.Atoi(res.Header.Get("Retry-After"))
	if res.StatusCode != 429 || ra < 1 || res.Header.Get("Retry-After-Ms") != strconv.Itoa(ra*1000) ||
		res.Header.Get("X-Should-Retry") != "" || !strings.HasPrefix(body, `{"type":"error","error":{"type":"rate_limit_error","message":`) {
		t.Errorf("anthropic 429: %d %v %s", res.StatusCode, res.Header, body)
	}
	// Unbounded under a strict budget.
	res = e.call(t, context.Background(), "/v1/messages", "sk-ant-h", `{"messages":[]}`)
	body = read(res)
	if res.StatusCode != 400 || !strings.Contains(body, `"type":"invalid_request_error"`) || !strings.Contains(body, "sets no max_tokens") {
		t.Errorf("anthropic unbounded: %d %s", res.StatusCode, body)
	}
}

// TestLLMInputAndOutputApart: an input and an output budget on the same
// calls, each counting its part: the output's strict budget takes
// max_tokens times n before the call and keeps what the usage reports;
// the input's takes the body's bytes; a call with no max_tokens is
// refused by the output budget alone.
func TestLLMInputAndOutputApart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, file, `key_secret_env: DRIP_KEY_SECRET
rules:
  - name: input
    limit_keys: ["hash:api_key"]
    cost_from_response: openai:input
    algorithm_config: {rate: 1000, period: 1h, cost_source: openai:input}
  - name: output
    limit_keys: ["hash:api_key"]
    budget: strict
    cost_from_response: openai:output
    algorithm: fixed_window
    algorithm_config: {rate: 500, period: day, cost_source: openai:output}
`)
	e := newLLMEnv(t, memstore.New(), file)
	res := e.call(t, context.Background(), "/v1/chat/completions", "sk-io", `{"max_tokens":100,"n":2}`, "X-Test-Prompt-Tokens", "7")
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("%d", res.StatusCode)
	}
	e.waitEvent(t, "output", "refunded", 1)
	e.waitEvent(t, "input", "refunded", 1)
	if in, out := e.left(t, "input", "sk-io"), e.left(t, "output", "sk-io"); in != 1000-7 || out != 500-20 {
		t.Errorf("input %v, output %v left; want 993 and 480", in, out)
	}
	// 480 output tokens left: 300 * 2 choices cannot be reserved.
	res = e.call(t, context.Background(), "/v1/chat/completions", "sk-io", `{"max_tokens":300,"n":2}`)
	res.Body.Close()
	if res.StatusCode != 429 {
		t.Errorf("600 output tokens with 480 left: %d", res.StatusCode)
	}
	res = e.call(t, context.Background(), "/v1/chat/completions", "sk-io", `{"messages":[]}`)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 400 || !strings.Contains(string(b), `\"output\" is a strict budget`) {
		t.Errorf("no max_tokens: %d %s", res.StatusCode, b)
	}
}

// TestLLMHashedKeyByRule: the decision API, asked by rule with the API
// key in clear, takes from the bucket a request with that key uses,
// keyed by its hash.
func TestLLMHashedKeyByRule(t *testing.T) {
	t.Setenv("DRIP_KEY_SECRET", llmSecret)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, file, `key_secret_env: DRIP_KEY_SECRET
rules:
  - name: requests
    limit_keys: ["hash:api_key"]
    algorithm_config: {rate: 10, period: 24h}
`)
	set, err := rules.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New()
	t.Cleanup(func() { st.Close() })
	srv := start(t, Config{Rules: file, WatchEvery: -1}, st)
	for range 3 {
		if code, body := call(t, "POST", srv.base+"/v1/take", `{"rule": "requests", "values": ["sk-by-hand"]}`); code != 200 {
			t.Fatalf("%d %s", code, body)
		}
	}
	if code, body := call(t, "POST", srv.base+"/v1/take", `{"rule": "requests", "values": {"hash:api_key": "sk-by-hand"}}`); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	r, _ := set.Rule("requests")
	vals, _ := r.KeyValues(func(rules.Source) (string, bool) { return "sk-by-hand", true })
	m, err := drip.Apply(context.Background(), st, bucket.Peek, time.Time{}, drip.Request{Key: r.Key(vals), Limit: r.Limit})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Decisions[0].Tokens; got > 6.01 || got < 6 { // 0.01: 86 s of refill
		t.Errorf("the hashed key's bucket holds %v after 4 takes by hand, want 6", got)
	}
}

// TestLLMNestedBudgets: an organisation's, a team's, an API key's and
// an end user's strict budgets on each call, the user and team read from
// the verified token that is the API key: a call one budget denies
// spends nothing in any of them; another user of the team still passes.
func TestLLMNestedBudgets(t *testing.T) {
	t.Setenv("DRIP_JWT_SECRET", llmSecret)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	budget := func(name, keys string, rate int) string {
		return fmt.Sprintf(`  - name: %s
    limit_keys: %s
    budget: strict
    cost_from_response: openai
    algorithm: fixed_window
    algorithm_config: {rate: %d, period: day, cost_source: openai}
`, name, keys, rate)
	}
	writeFile(t, file, "key_secret_env: DRIP_KEY_SECRET\njwt: {hmac_secret_env: DRIP_JWT_SECRET}\nrules:\n"+
		budget("org", `["jwt:org"]`, 10000)+budget("team", `["jwt:org", "jwt:team"]`, 5000)+
		budget("key", `["hash:api_key"]`, 4000)+budget("user", `["jwt:org", "jwt:sub"]`, 300))
	e := newLLMEnv(t, memstore.New(), file)
	token := func(sub string) string {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"org": "acme", "team": "ml", "sub": sub,
			"exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(llmSecret))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	alice, bob := token("alice"), token("bob")
	post := func(key, body string) int {
		res := e.call(t, context.Background(), "/v1/chat/completions", key, body)
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	left := func(who string) [4]float64 {
		t.Helper()
		var out [4]float64
		for i, name := range []string{"org", "team", "key", "user"} {
			r, _ := e.set.Rule(name)
			vals, _ := r.KeyValues(func(s rules.Source) (string, bool) {
				switch s.Name {
				case "org":
					return "acme", true
				case "team":
					return "ml", true
				case "sub":
					return map[string]string{alice: "alice", bob: "bob"}[who], true
				}
				return who, true // api_key
			})
			m, err := drip.Apply(context.Background(), e.st, bucket.Peek, time.Time{}, drip.Request{Key: r.Key(vals), Limit: r.Limit})
			if err != nil {
				t.Fatal(err)
			}
			out[i] = m.Decisions[0].Tokens
		}
		return out
	}
	if code := post(alice, `{"max_tokens":150}`); code != 200 {
		t.Fatalf("alice: %d", code)
	}
	e.waitEvent(t, "user", "refunded", 1)
	want := [4]float64{10000 - 30, 5000 - 30, 4000 - 30, 300 - 30}
	if got := left(alice); got != want {
		t.Fatalf("after 30 tokens: %v, want %v", got, want)
	}
	// Alice's 270 cannot hold a bound of 300 tokens: denied, and none of
	// the four budgets moves.
	if code := post(alice, `{"max_tokens":280}`); code != 429 {
		t.Fatalf("alice over her budget: %d", code)
	}
	if got := left(alice); got != want {
		t.Errorf("after a denied call: %v, want %v", got, want)
	}
	if code := post(bob, `{"max_tokens":280}`); code != 200 {
		t.Errorf("bob: %d", code)
	}
}
