package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/driplimit/drip/store/memstore"
)

// stall sends the headers of a POST with a body of 200 KiB (under the
// decision API's cap, which refuses a longer one before reading it) and
// 150 KiB of that body, then stops sending. It returns the connection.
const stallLength, stallSent = 200 << 10, 150 << 10

func stall(t *testing.T, addr, path string, hdr ...string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: drip\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", path, stallLength)
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte(`{"key": "` + strings.Repeat("a", stallSent))); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestStalledBodiesCut: connections that send most of a body and stall
// (1,500 of them had held 1.9 GB, some for minutes) are cut on every
// listener once Config.ReadTimeout passes: the server answers or closes,
// the connection ends, and the handlers and their goroutines are gone.
func TestStalledBodiesCut(t *testing.T) {
	const (
		perListener = 20
		readTimeout = 2 * time.Second  // what the test checks, injected
		generous    = 60 * time.Second // what it does not
	)
	var upMu sync.Mutex
	var upErrs []error
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		upMu.Lock()
		upErrs = append(upErrs, err)
		upMu.Unlock()
	}))
	t.Cleanup(up.Close)
	api := start(t, Config{ReadTimeout: readTimeout, AdminToken: "T"}, memstore.New())
	gw := start(t, Config{ReadTimeout: readTimeout, Upstream: up.URL, AdminListen: "off"}, memstore.New())
	base := runtime.NumGoroutine()

	type target struct{ name, addr, path, auth string }
	targets := []target{
		{"decision API", api.Addr().String(), "/v1/take", ""},
		{"admin", api.AdminAddr().String(), "/v1/admin/reset", "Bearer T"},
		{"gateway", gw.Addr().String(), "/upload", ""},
	}
	var conns []net.Conn
	var names []string
	for _, tg := range targets {
		for range perListener {
			var hdr []string
			if tg.auth != "" {
				hdr = []string{"Authorization", tg.auth}
			}
			conns = append(conns, stall(t, tg.addr, tg.path, hdr...))
			names = append(names, tg.name)
		}
	}
	during := runtime.NumGoroutine()

	start := time.Now()
	var wg sync.WaitGroup
	status := make([]string, len(conns))
	errs := make([]error, len(conns))
	for i, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(time.Now().Add(generous))
			line, _ := bufio.NewReader(c).ReadString('\n')
			status[i] = strings.TrimSpace(line)
			_, err := io.Copy(io.Discard, c) // to EOF: the server closed it
			errs[i] = err
		})
	}
	wg.Wait()
	cut := time.Since(start)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s connection %d: %v: the server kept a stalled body's connection open", names[i], i, err)
		}
	}
	for i, st := range status {
		// The decision API and the admin API answer 408; the gateway's
		// proxy could not send the body, and answers 502 or just closes.
		want := map[string][]string{
			"decision API": {"HTTP/1.1 408 Request Timeout"},
			"admin":        {"HTTP/1.1 408 Request Timeout"},
			"gateway":      {"HTTP/1.1 502 Bad Gateway", ""},
		}[names[i]]
		if !contains(want, st) {
			t.Errorf("%s connection %d: answered %q, want one of %q", names[i], i, st, want)
		}
	}

	deadline := time.Now().Add(generous)
	for runtime.NumGoroutine() > base+5 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after the stalled connections were cut, %d before they came: handlers still running?\n%s",
				runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
	upMu.Lock()
	for i, err := range upErrs {
		if err == nil {
			t.Errorf("upstream request %d read a whole body that was never sent", i)
		}
	}
	upMu.Unlock()
	t.Logf("%d stalled bodies (3 listeners): goroutines %d before, %d while stalled, %d after; all cut %.1fs after the stall began (ReadTimeout %s)",
		len(conns), base, during, runtime.NumGoroutine(), cut.Seconds(), readTimeout)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestStallBodyEndsAfterResponse: the gateway's body, read to its end
// and read once more after the response has begun, ends (io.EOF) rather
// than failing. http.Transport, forwarding it, reads once past
// Content-Length, and on an error drops the upstream connection: a
// streamed answer was cut when that read came after net/http had closed
// the request's body, as it does once a response begins.
func TestStallBodyEndsAfterResponse(t *testing.T) {
	const body = `{"model":"m","max_tokens":10}`
	errs := make(chan error, 1)
	ts := httptest.NewServer(stallCut(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadFull(r.Body, make([]byte, r.ContentLength))
		if err == nil {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			_ = http.NewResponseController(w).Flush()
			_, err = r.Body.Read(make([]byte, 1))
		}
		errs <- err
	}), time.Minute))
	defer ts.Close()
	res, err := ts.Client().Post(ts.URL, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err := <-errs; err != io.EOF {
		t.Errorf("a read of the body after the response began: %v, want io.EOF", err)
	}
}
