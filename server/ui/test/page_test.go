package test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

var screenshot = flag.String("screenshot", "", "also write the page's screenshot to this file (docs/who-is-limited.png)")

// repoRoot is drip's repository, three levels up.
const repoRoot = "../../.."

// dripBin is drip, built from this repository by TestMain.
var dripBin string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "dripui")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		dripBin = filepath.Join(dir, "drip")
		// The container image's build flags (the Makefile's STATIC_ENV
		// and STATIC_FLAGS): make test's go vet and deploy's container
		// test compile with them, so this build links the packages they
		// compile instead of compiling the whole dependency tree once
		// more with the default flags.
		build := exec.Command("go", "build", "-trimpath", "-o", dripBin, "./cmd/drip")
		build.Dir = repoRoot
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building drip: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}())
}

// chromium finds Debian's chromium; without it the test is skipped, or
// fails under CI=true.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (Debian: apt-get install chromium)")
	}
	t.Skip("SKIP test dependency missing: chromium")
	return ""
}

const token = "page-t0ken"

const rulesFile = `{"rules": [
  {"name": "zipf", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1000000, "burst": 1000000}},
  {"name": "tight", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 5}},
  {"name": "busy", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 20, "burst": 20}}]}`

// serve runs drip serve until the test ends and returns its two base
// URLs.
func serve(t *testing.T) (api, adminURL string) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.json")
	if err := os.WriteFile(rules, []byte(rulesFile), 0o644); err != nil {
		t.Fatal(err)
	}
	ports := [2]string{freePort(t), freePort(t)}
	cmd := exec.Command(dripBin, "serve", "--rules", rules, "--listen", "127.0.0.1:"+ports[0],
		"--admin-listen", "127.0.0.1:"+ports[1], "--admin-token", token)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	api, adminURL = "http://127.0.0.1:"+ports[0], "http://127.0.0.1:"+ports[1]
	deadline := time.Now().Add(time.Minute)
	for {
		if r, err := http.Get(adminURL + "/readyz"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return api, adminURL
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("drip serve is not ready after a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// post sends a JSON body and decodes the answer into out (if not nil).
func post(url, body string, out any) (int, error) {
	r, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return 0, fmt.Errorf("%s: %v: %s", url, err, b)
		}
	}
	return r.StatusCode, nil
}

// postJSON is post on the test's goroutine: an error fails the test.
func postJSON(t *testing.T, url, body string, out any) int {
	t.Helper()
	code, err := post(url, body, out)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

type decision struct {
	Allowed   bool  `json:"allowed"`
	Remaining int64 `json:"remaining"`
	Limit     int64 `json:"limit"`
}

// zipfLoad sends n takes of rule zipf through the decision API, keys
// drawn from a Zipf law over 100,000 keys whose 10 most frequent send
// 30% of the requests (multi-takes of distinct keys), and returns the
// exact count of each bucket key.
func zipfLoad(t *testing.T, api string, n int) map[string]int {
	z := rand.NewZipf(rand.New(rand.NewPCG(39, 39)), 1.05, 1, 100_000-1)
	exact := map[string]int{}
	var batches [][]string
	var cur []string
	in := map[string]bool{}
	for range n {
		k := "k" + strconv.FormatUint(z.Uint64(), 10)
		exact["zipf|"+k]++
		if in[k] {
			batches = append(batches, cur)
			cur, in = nil, map[string]bool{}
		}
		cur = append(cur, k)
		in[k] = true
	}
	batches = append(batches, cur)
	var wg sync.WaitGroup
	work := make(chan []string)
	for range 4 {
		wg.Go(func() {
			for b := range work {
				items := make([]string, len(b))
				for i, k := range b {
					items[i] = `{"rule": "zipf", "values": ["` + k + `"]}`
				}
				if code, err := post(api+"/v1/take", `{"requests": [`+strings.Join(items, ",")+`]}`, nil); code != 200 {
					t.Errorf("multi-take: %d %v", code, err)
				}
			}
		})
	}
	for _, b := range batches {
		work <- b
	}
	close(work)
	wg.Wait()
	return exact
}

// row is a row of a list of top keys, as the page shows it.
type row struct {
	Key          string
	Count, Error int
}

// TestPage drives the admin page in Chromium against a live drip serve
// under traffic.
func TestPage(t *testing.T) {
	execPath := chromium(t)
	api, adminURL := serve(t)

	const n = 100_000
	exact := zipfLoad(t, api, n)
	var keys []string
	for k := range exact {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return exact[keys[i]] > exact[keys[j]] })
	heavy := keys[:10]
	sum := 0
	for _, k := range heavy {
		sum += exact[k]
	}
	if share := float64(sum) / n; share < 0.28 || share > 0.32 {
		t.Fatalf("the 10 heaviest keys sent %.3f of the requests, want 0.30", share)
	}

	// Traffic on another rule while the page is open: its chart moves.
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			post(api+"/v1/take", `{"rule": "busy", "values": ["b`+strconv.Itoa(i%3)+`"], "cost": 3}`, nil)
		}
	})
	defer bg.Wait()
	defer close(stop)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(execPath), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.NoFirstRun, chromedp.WindowSize(1000, 1400))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	// The first call starts the browser, on a context without a deadline
	// (its deadline would end the browser); the others have one.
	if err := chromedp.Do(bctx, chromedp.Navigate(adminURL+"/ui/")); err != nil {
		t.Fatalf("open the page: %v", err)
	}
	ctx, cancel := context.WithTimeout(bctx, 4*time.Minute)
	defer cancel()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	change := void(chromedp.Evaluate[bool](`document.querySelector("#window").dispatchEvent(new Event("change"))`))

	// Without the token the page shows nothing but the form; a wrong
	// token is refused.
	do("a wrong token",
		chromedp.WaitVisible(css("#login")),
		chromedp.SendKeys(css("#token"), "wrong"),
		chromedp.Click(css("#login-button")),
		void(chromedp.Poll[bool](`document.querySelector("#login-error").textContent.includes("Refused")`)))
	if hidden := get(t, ctx, chromedp.Evaluate[bool](`document.querySelector("#app").hidden`)); !hidden {
		t.Error("with a wrong token, the page shows its data")
	}
	do("sign in",
		chromedp.SendKeys(css("#token"), token),
		chromedp.Click(css("#login-button")),
		chromedp.WaitVisible(css("#app")))
	if get(t, ctx, chromedp.Evaluate[bool](`getComputedStyle(document.querySelector("#login")).display !== "none"`)) {
		t.Error("signed in, the page still shows the sign-in form")
	}
	if url := get(t, ctx, chromedp.Location()); strings.Contains(url, token) {
		t.Errorf("the token is in the URL: %s", url)
	}

	// The top keys of the whole workload (the hour's window covers it):
	// the 10 heaviest first, each count within its stated error.
	do("the hour",
		chromedp.SetValue(css("#window"), "1h"), change,
		void(chromedp.Poll[bool](`(() => { const h = document.querySelector('.rule[data-rule="zipf"] h3'); return !!h && h.textContent.includes("`+strconv.Itoa(n)+` requests") })()`)))
	rows := get(t, ctx, chromedp.Evaluate[[]row](`[...document.querySelectorAll('table[data-rule="zipf"][data-list="requests"] tbody tr')].map(r => ({
		Key: r.dataset.key, Count: +r.querySelector(".count").textContent, Error: +r.querySelector(".err").textContent.slice(1)}))`))
	if len(rows) != 10 {
		t.Fatalf("%d rows of top requests: %+v", len(rows), rows)
	}
	var first []string
	for _, r := range rows {
		first = append(first, r.Key)
		if tr := exact[r.Key]; r.Count < tr || r.Count-r.Error > tr {
			t.Errorf("%s: the page says %d ± %d, the true count is %d", r.Key, r.Count, r.Error, tr)
		}
	}
	t.Logf("the page's first 10: %+v", rows)
	slices.Sort(first)
	want := slices.Clone(heavy)
	slices.Sort(want)
	if !slices.Equal(first, want) {
		t.Errorf("the first 10 keys listed are %v, the heaviest %v", first, want)
	}

	// A tenant's lookup shows what the decision API says.
	for range 2 {
		postJSON(t, api+"/v1/take", `{"rule": "tight", "values": ["tenant1"]}`, nil)
	}
	do("tenant lookup",
		chromedp.SendKeys(css("#t-headers"), "x-api-key: tenant1"),
		chromedp.Click(css("#t-go")),
		chromedp.WaitVisible(css(`#tenant-out tr[data-rule="tight"]`)))
	remaining := get(t, ctx, chromedp.Text(css(`#tenant-out tr[data-rule="tight"] .remaining`)))
	limit := get(t, ctx, chromedp.Text(css(`#tenant-out tr[data-rule="tight"] .limit`)))
	var d decision
	postJSON(t, api+"/v1/peek", `{"rule": "tight", "values": ["tenant1"], "cost": 0}`, &d)
	if remaining != strconv.FormatInt(d.Remaining, 10) || limit != strconv.FormatInt(d.Limit, 10) {
		t.Errorf("the page says %s of %s left, the decision API %d of %d", remaining, limit, d.Remaining, d.Limit)
	}

	// An override set, then edited, on the page applies to the next
	// request.
	take := func() decision {
		var d decision
		postJSON(t, api+"/v1/take", `{"rule": "tight", "values": ["tenant1"]}`, &d)
		return d
	}
	do("set an override",
		chromedp.SetValue(css("#o-rule"), "tight"),
		chromedp.SendKeys(css("#o-values"), "tenant1"),
		chromedp.SendKeys(css("#o-rate"), "1000"),
		chromedp.SendKeys(css("#o-burst"), "1000"),
		chromedp.Click(css("#o-set")),
		chromedp.WaitVisible(css(`#overrides tr[data-key="tight|tenant1"]`)))
	if d := take(); d.Limit != 1000 || !d.Allowed {
		t.Errorf("after the override set on the page: %+v, want a limit of 1000", d)
	}
	ov := `#overrides tr[data-key="tight|tenant1"] `
	do("edit the override",
		chromedp.SetValue(css(ov+".rate"), ""),
		chromedp.SendKeys(css(ov+".rate"), "50"),
		chromedp.SetValue(css(ov+".burst"), ""),
		chromedp.SendKeys(css(ov+".burst"), "50"),
		void(chromedp.Evaluate[bool](`document.querySelector("#o-msg").textContent = ""; true`)),
		chromedp.Click(css(ov+".save")),
		void(chromedp.Poll[bool](`document.querySelector("#o-msg").textContent.startsWith("Set")`)))
	if d := take(); d.Limit != 50 {
		t.Errorf("after the override edited on the page: %+v, want a limit of 50", d)
	}

	// The live chart draws the busy rule's decisions and denials.
	do("chart", void(chromedp.Poll[bool](`document.querySelectorAll("#chart polyline").length >= 2`)))

	do("the minute",
		chromedp.SetValue(css("#window"), "1m"), change,
		chromedp.Sleep(2500*time.Millisecond), // two more points on the chart
		chromedp.EmulateViewport(900, 1000),
		void(chromedp.Evaluate[bool](`window.scrollTo(0, 0); true`)))
	png := get(t, ctx, chromedp.CaptureScreenshot())
	out := filepath.Join(t.TempDir(), "who-is-limited.png")
	if *screenshot != "" {
		out = *screenshot
	}
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}

	// At a phone's width the page fits: nothing wider than the screen.
	do("phone width",
		chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile),
		chromedp.Sleep(300*time.Millisecond))
	if get(t, ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`)) {
		t.Error("at 390 px wide, the page is wider than the screen")
	}

	// Signed out, the page refuses to show anything again.
	do("sign out", chromedp.Click(css("#logout")), chromedp.WaitVisible(css("#login")))
	if !get(t, ctx, chromedp.Evaluate[bool](`document.querySelector("#app").hidden && sessionStorage.length === 0`)) {
		t.Error("signed out, the page still shows its data or keeps the token")
	}
}

// get runs a and returns its value; an error fails the test.
func get[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// void is a for chromedp.Do, its value dropped.
func void[T any](a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := a(ctx, tg)
		return chromedp.Void{}, err
	}
}
