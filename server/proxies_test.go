package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/internal/testkit/pathtest"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/memstore"
)

// The shipped front-door configs, run by real nginx and Caddy in front of
// drip serve's /v1/forward-auth and an app. Each config is used as
// shipped except for its three addresses, which the test replaces
// textually to run on free ports: 127.0.0.1:8000 (where the proxy
// listens), 127.0.0.1:8080 (drip) and 127.0.0.1:9000 (the app).

// frontDoor is one proxy and its shipped config.
type frontDoor struct {
	name   string
	config string // under examples/
	server string // what its Server header holds
	start  func(t *testing.T, dir, file string) *testserver.Process
}

var frontDoors = []frontDoor{
	{"nginx", "nginx/nginx.conf", "nginx", func(t *testing.T, dir, file string) *testserver.Process {
		bin := testserver.Binary(t, "nginx", "nginx", "/usr/sbin/nginx")
		// In the foreground, as one process (no master forking workers
		// that would outlive a test binary that dies), logging to
		// standard error: the config itself is run unchanged.
		cmd := exec.Command(bin, "-p", dir, "-c", file, "-e", "stderr", "-g", "daemon off; master_process off;")
		cmd.Dir = dir
		return testserver.StartProcess(t, cmd)
	}},
	{"caddy", "caddy/Caddyfile", "Caddy", func(t *testing.T, dir, file string) *testserver.Process {
		bin := testserver.Binary(t, "caddy", "caddy", "/usr/bin/caddy")
		cmd := exec.Command(bin, "run", "--config", file, "--adapter", "caddyfile")
		cmd.Dir = dir
		// Caddy keeps its state (an autosaved config) under HOME.
		cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
		return testserver.StartProcess(t, cmd)
	}},
}

// app is the application behind the proxy: it records the requests it
// serves per client, as the proxy names the client to it
// (X-Forwarded-For): the target of a GET, the method, target and body of
// any other.
type app struct {
	*httptest.Server
	mu   sync.Mutex
	seen map[string][]string
}

func newApp(t *testing.T) *app {
	a := &app{seen: map[string][]string{}}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		client := strings.Join(r.Header.Values("X-Forwarded-For"), ", ")
		seen := r.URL.RequestURI()
		if r.Method != "GET" {
			body, _ := io.ReadAll(r.Body)
			seen = r.Method + " " + seen + " " + string(body)
		}
		a.seen[client] = append(a.seen[client], seen)
		a.mu.Unlock()
		fmt.Fprintf(w, "app: %s", r.URL.RequestURI())
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *app) requests(client string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.seen[client])
}

// startFrontDoor runs fd's shipped config in front of drip at dripAddr
// and the app at appAddr, and returns the proxy's base URL once it
// answers. A port taken between the test choosing it and the proxy
// binding it makes the proxy exit: then another port is tried.
func startFrontDoor(t *testing.T, fd frontDoor, dripAddr, appAddr string) string {
	t.Helper()
	shipped, err := os.ReadFile(filepath.Join("..", "examples", fd.config))
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"127.0.0.1:8000", "127.0.0.1:8080", "127.0.0.1:9000"} {
		if !strings.Contains(string(shipped), addr) {
			t.Fatalf("examples/%s does not mention %s", fd.config, addr)
		}
	}
	for attempt := 0; ; attempt++ {
		listen := "127.0.0.1:" + strconv.Itoa(testserver.FreePort(t, 0))
		conf := strings.NewReplacer("127.0.0.1:8000", listen, "127.0.0.1:8080", dripAddr, "127.0.0.1:9000", appAddr).Replace(string(shipped))
		dir := t.TempDir()
		file := filepath.Base(fd.config)
		if err := os.WriteFile(filepath.Join(dir, file), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		p := fd.start(t, dir, file)
		base := "http://" + listen
		// Ready when an answer comes from the proxy itself (its Server
		// header), not from whatever else might hold the port. The probe
		// comes from 127.0.0.1, a client of its own.
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) && !p.Exited() {
			resp, err := http.Get(base + "/ready")
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if strings.Contains(strings.Join(resp.Header.Values("Server"), " "), fd.server) {
					return base
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		p.Stop()
		if attempt == 4 || !strings.Contains(p.Output(), "in use") {
			t.Fatalf("%s did not answer on %s within 30 s (attempt %d):\n%s", fd.name, listen, attempt+1, p.Output())
		}
	}
}

// clientFrom is an HTTP client whose connections come from the loopback
// address src: the proxy sees each client at its own address.
func clientFrom(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 30 * time.Second}
}

// fetch GETs url with c and the headers hdr (name, value, ...), and
// returns the response with its body read.
func fetch(t *testing.T, c *http.Client, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestForwardAuthProxies: through the shipped nginx and Caddy configs, a
// client over its limit gets 429 with Retry-After, the RateLimit headers
// and the problem body from the proxy; allowed responses carry the
// RateLimit headers; a client's own X-Forwarded-For (and X-Real-IP,
// Forwarded) changes nothing; each client has its own bucket (drip keys on
// the client the proxy saw, not on the proxy); the app sees exactly the
// allowed requests.
func TestForwardAuthProxies(t *testing.T) {
	for _, fd := range frontDoors {
		t.Run(fd.name, func(t *testing.T) {
			a := newApp(t)
			rules := filepath.Join(t.TempDir(), "rules.json")
			writeFile(t, rules, `{"trusted_proxies": ["127.0.0.1/32"], "rules": [
			  {"name": "per-ip", "limit_keys": ["ip:address"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 3}},
			  {"name": "uploads", "limit_keys": ["ip:address"], "match": {"method": "POST", "path": "/upload/*"},
			   "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}},
			  {"name": "slot", "limit_keys": ["ip:address"], "match": {"path": "/slot/*"}, "algorithm": "concurrency",
			   "algorithm_config": {"max_in_flight": 1}}]}`)
			srv := start(t, Config{Rules: rules, WatchEvery: -1, AdminListen: "off"}, memstore.New())
			base := startFrontDoor(t, fd, srv.Addr().String(), a.Listener.Addr().String())

			alice, bob := clientFrom("127.0.0.2"), clientFrom("127.0.0.3")
			for i := range 4 {
				forged := fmt.Sprintf("203.0.113.%d", i+1)
				resp, body := fetch(t, alice, fmt.Sprintf("%s/hello?i=%d", base, i),
					"X-Forwarded-For", forged, "X-Real-IP", forged, "Forwarded", "for="+forged)
				if err := sfv.CheckHeaders(resp.Header.Get); err != nil {
					t.Errorf("request %d: %v", i, err)
				}
				if got := resp.Header.Get("RateLimit-Policy"); got != `"per-ip";q=3;w=10800` {
					t.Errorf("request %d: RateLimit-Policy %q", i, got)
				}
				if i < 3 {
					if resp.StatusCode != 200 || body != fmt.Sprintf("app: /hello?i=%d", i) {
						t.Fatalf("request %d: %d %q, want the app's 200", i, resp.StatusCode, body)
					}
					want := map[string]string{
						"RateLimit":           fmt.Sprintf(`"per-ip";r=%d;t=%d`, 2-i, 3600*(i+1)),
						"RateLimit-Limit":     "3",
						"RateLimit-Remaining": strconv.Itoa(2 - i),
						"RateLimit-Reset":     strconv.Itoa(3600 * (i + 1)),
						"Retry-After":         "",
					}
					for h, v := range want {
						if got := resp.Header.Get(h); got != v {
							t.Errorf("request %d: %s %q, want %q", i, h, got, v)
						}
					}
					continue
				}
				if resp.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("request over the limit: %d %q, want 429", resp.StatusCode, body)
				}
				ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
				if err != nil || ra < 3600 || ra > 5400 {
					t.Errorf("429: Retry-After %q, want within [3600, 5400]", resp.Header.Get("Retry-After"))
				}
				if got := resp.Header.Get("RateLimit-Remaining"); got != "0" {
					t.Errorf("429: RateLimit-Remaining %q", got)
				}
				if got, want := resp.Header.Get("RateLimit"), fmt.Sprintf(`"per-ip";r=0;t=%d`, ra); got != want {
					t.Errorf("429: RateLimit %q, want %q", got, want)
				}
				if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
					t.Errorf("429: Content-Type %q", ct)
				}
				var p struct {
					Status     int    `json:"status"`
					Rule       string `json:"rule"`
					Reason     string `json:"reason"`
					RetryAfter int    `json:"retry_after"`
				}
				if err := json.Unmarshal([]byte(body), &p); err != nil || p.Status != 429 || p.Rule != "per-ip" || p.Reason != "token_bucket_exceeded" || p.RetryAfter != ra {
					t.Errorf("429 body %q: want drip's problem+json (%v)", body, err)
				}
			}

			resp, body := fetch(t, bob, base+"/other", "X-Forwarded-For", "127.0.0.2")
			if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Remaining") != "2" {
				t.Fatalf("another client: %d %q, RateLimit-Remaining %q: want its own bucket", resp.StatusCode, body, resp.Header.Get("RateLimit-Remaining"))
			}

			// The proxy tells drip the method and the path: the second
			// upload is over uploads' limit, a GET there is not; the
			// upload's body reaches the app whole.
			carol := clientFrom("127.0.0.4")
			for i, st := range []struct {
				method, path string
				want         int
			}{{"POST", "/upload/a", 200}, {"POST", "/upload/b", 429}, {"GET", "/upload/c", 200}} {
				req, _ := http.NewRequest(st.method, base+st.path, strings.NewReader("payload "+strconv.Itoa(i)))
				resp, err := carol.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != st.want {
					t.Errorf("%s %s: %d %q, want %d", st.method, st.path, resp.StatusCode, body, st.want)
				}
				if st.want == 429 && !strings.Contains(string(body), `"rule":"uploads"`) {
					t.Errorf("%s %s: body %q: want uploads' denial", st.method, st.path, body)
				}
			}
			if got, want := a.requests("127.0.0.4"), []string{"POST /upload/a payload 0", "/upload/c"}; !slices.Equal(got, want) {
				t.Errorf("the app saw %q from 127.0.0.4, want %q", got, want)
			}

			// A concurrency rule, the tightest, has no window: the proxy
			// passes on no RateLimit-Reset (not even an empty one).
			resp, _ = fetch(t, clientFrom("127.0.0.5"), base+"/slot/x")
			if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != `"per-ip";r=2;t=3600, "slot";r=0` {
				t.Errorf("/slot/x: %d, RateLimit %q", resp.StatusCode, resp.Header.Get("RateLimit"))
			}
			if v, ok := resp.Header["Ratelimit-Reset"]; ok {
				t.Errorf("/slot/x: RateLimit-Reset %q, want none", v)
			}
			if err := sfv.CheckHeaders(resp.Header.Get); err != nil {
				t.Errorf("/slot/x: %v", err)
			}

			if got, want := a.requests("127.0.0.2"), []string{"/hello?i=0", "/hello?i=1", "/hello?i=2"}; !slices.Equal(got, want) {
				t.Errorf("the app saw %q from 127.0.0.2, want %q", got, want)
			}
			if got := a.requests("127.0.0.3"); !slices.Equal(got, []string{"/other"}) {
				t.Errorf("the app saw %q from 127.0.0.3, want [/other]", got)
			}
			a.mu.Lock()
			for client := range a.seen {
				if client != "127.0.0.1" && client != "127.0.0.2" && client != "127.0.0.3" && client != "127.0.0.4" && client != "127.0.0.5" {
					t.Errorf("the app saw a client %q: a forged header got through", client)
				}
			}
			a.mu.Unlock()
		})
	}
}

// TestForwardAuthProxiesStoreDown: when the store fails and the rule says
// deny, the client gets drip's 503 and problem body from the proxy (nginx
// rebuilds it from Drip-Status and Drip-Problem), and the app nothing.
func TestForwardAuthProxiesStoreDown(t *testing.T) {
	for _, fd := range frontDoors {
		t.Run(fd.name, func(t *testing.T) {
			a := newApp(t)
			rules := filepath.Join(t.TempDir(), "rules.json")
			writeFile(t, rules, `{"trusted_proxies": ["127.0.0.1/32"], "on_error": "deny", "rules": [
			  {"name": "per-ip", "limit_keys": ["ip:address"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 3}}]}`)
			srv := start(t, Config{Rules: rules, WatchEvery: -1, AdminListen: "off"}, failing{})
			base := startFrontDoor(t, fd, srv.Addr().String(), a.Listener.Addr().String())

			resp, body := fetch(t, clientFrom("127.0.0.2"), base+"/hello")
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("store down, on_error deny: %d %q, want 503", resp.StatusCode, body)
			}
			var prob struct {
				Status int    `json:"status"`
				Reason string `json:"reason"`
			}
			if err := json.Unmarshal([]byte(body), &prob); err != nil || prob.Status != 503 || prob.Reason != "store_unavailable" {
				t.Errorf("503 body %q: want drip's problem+json (%v)", body, err)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
				t.Errorf("503: Content-Type %q", ct)
			}
			if got := a.requests("127.0.0.2"); len(got) != 0 {
				t.Errorf("the app saw %q, want nothing", got)
			}
		})
	}
}

// TestForwardAuthProxiesAmbiguousTarget: a request target with '#' or
// '\' is read differently by apps and by drip (an app that stops the path
// at '#' routes "/search#/../x" to /search, which drip would read as /x
// and spare from the search rule). nginx passes such a target on as the
// client sent it: the ask is refused, so it never reaches the app. Caddy
// escapes both ("/search%23/../x"), which every reader reads as drip does:
// it may pass. The same requests spelled plainly pass.
func TestForwardAuthProxiesAmbiguousTarget(t *testing.T) {
	for _, fd := range frontDoors {
		t.Run(fd.name, func(t *testing.T) {
			var mu sync.Mutex
			var raw []string // the targets the app got, as they came
			a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				raw = append(raw, r.RequestURI)
				mu.Unlock()
			}))
			t.Cleanup(a.Close)
			rules := filepath.Join(t.TempDir(), "rules.json")
			writeFile(t, rules, `{"trusted_proxies": ["127.0.0.1/32"], "rules": [
			  {"name": "search", "limit_keys": ["ip:address"], "match": {"path": "/search/*"},
			   "algorithm_config": {"rate": 1, "period": "1h", "burst": 100}}]}`)
			srv := start(t, Config{Rules: rules, WatchEvery: -1, AdminListen: "off"}, memstore.New())
			base := startFrontDoor(t, fd, srv.Addr().String(), a.Listener.Addr().String())
			get := func(target string) int {
				c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", target)
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("GET %s: %v", target, err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			for _, target := range []string{"/search#/../x", "/search/a#/../../x", `/x\..\search\a`} {
				code := get(target)
				mu.Lock()
				got := slices.Contains(raw, target)
				mu.Unlock()
				if got || (fd.name == "nginx" && code < 400) {
					t.Errorf("GET %s: %d; the app got it as sent: %v", target, code, got)
				}
			}
			if code := get("/search/a"); code != 200 {
				t.Errorf("GET /search/a: %d", code)
			}
		})
	}
}

// TestForwardAuthProxiesPathSpellings: through the shipped nginx and Caddy
// configs, a request that spells a rule's path or method another way
// (pathtest.Cases) meets the rule or is refused, and never reaches the
// app; the proxy may refuse it first (nginx takes no lower-case method).
func TestForwardAuthProxiesPathSpellings(t *testing.T) {
	for _, fd := range frontDoors {
		t.Run(fd.name, func(t *testing.T) {
			var mu sync.Mutex
			var raw []string // the targets the app got, as they came
			a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				raw = append(raw, r.Method+" "+r.RequestURI)
				mu.Unlock()
			}))
			t.Cleanup(a.Close)
			rules := filepath.Join(t.TempDir(), "rules.json")
			writeFile(t, rules, pathtest.Rules)
			srv := start(t, Config{Rules: rules, WatchEvery: -1, AdminListen: "off"}, memstore.New())
			base := startFrontDoor(t, fd, srv.Addr().String(), a.Listener.Addr().String())
			var want []string
			for _, c := range append(pathtest.Drain, pathtest.Cases...) {
				resp, body := pathtest.Send(t, base, c.Method, c.Target)
				ours := strings.Contains(resp.Header.Get("Content-Type"), "application/problem+json")
				switch {
				case c.Want != 200 && resp.StatusCode == 400 && !ours:
					// The proxy refused it itself (nginx: "post", %00).
				case resp.StatusCode != c.Want:
					t.Errorf("%s %s: %d %q, want %d", c.Method, c.Target, resp.StatusCode, body, c.Want)
				case c.Want == 400 && !strings.Contains(body, `"reason":"ambiguous_path"`):
					t.Errorf("%s %s: 400 %q: want drip's problem with the reason ambiguous_path", c.Method, c.Target, body)
				}
				if c.Want == 200 {
					want = append(want, c.Method+" "+c.Target)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			got := slices.DeleteFunc(slices.Clone(raw), func(s string) bool { return s == "GET /ready" })
			if !slices.Equal(got, want) {
				t.Errorf("the app got %q, want %q", got, want)
			}
		})
	}
}
