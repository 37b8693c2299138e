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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/driplimit/drip/store/memstore"
)

// capped is the connection cap of the server's listener called name.
func (s *Server) cappedListener(t *testing.T, name string) interface {
	Open() int
	Peak() int
} {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.mu.Lock()
		for _, l := range s.listeners {
			if l.name == name && l.capped != nil {
				c := l.capped
				s.mu.Unlock()
				return c
			}
		}
		s.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("listener %s not served", name)
		}
		time.Sleep(time.Millisecond)
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestConnectionsCapped: 200 connections that each send headers and 150
// KiB of a 200 KiB body, then stall, hold no more than Config.MaxConnections
// (32 here) open at once: the rest are closed as accepted, and the
// server's goroutines and heap stay within what 32 connections cost,
// where 200 held bodies would take some 40 MB.
func TestConnectionsCapped(t *testing.T) {
	const (
		maxConns = 32
		conns    = 200
		generous = 30 * time.Second
	)
	srv := start(t, Config{MaxConnections: maxConns, ReadTimeout: time.Minute, AdminListen: "off"}, memstore.New())
	lst := srv.cappedListener(t, "api")
	baseG, baseHeap := runtime.NumGoroutine(), liveHeap()

	body := []byte(`{"key": "` + strings.Repeat("a", stallSent))
	var cs []net.Conn
	refused := 0
	for range conns {
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
		c.SetWriteDeadline(time.Now().Add(generous))
		_, err = fmt.Fprintf(c, "POST /v1/take HTTP/1.1\r\nHost: drip\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", stallLength)
		if err == nil {
			_, err = c.Write(body)
		}
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("connection %d: sending stalled for %s", len(cs), generous)
			}
			refused++ // closed by the server as it was accepted
		}
	}
	// The capped connections hold their bodies (150 KiB read of a buffer
	// of 200 KiB each): wait until the heap shows them, so that what is
	// measured is the stall.
	deadline := time.Now().Add(generous)
	var heap uint64
	for heap = liveHeap(); heap < baseHeap+maxConns*stallSent; heap = liveHeap() {
		if time.Now().After(deadline) {
			t.Fatalf("heap %d bytes over the baseline after the stall: the capped connections' bodies are not held", int64(heap)-int64(baseHeap))
		}
		time.Sleep(10 * time.Millisecond)
	}
	during := runtime.NumGoroutine()

	if p := lst.Peak(); p > maxConns {
		t.Errorf("%d connections accepted at once, cap %d", p, maxConns)
	}
	if g := during - baseG; g > 4*maxConns {
		t.Errorf("%d goroutines more while %d connections stall, cap %d", g, conns, maxConns)
	}
	grown := heap - baseHeap
	if limit := uint64(2*maxConns*stallLength + 8<<20); grown > limit {
		t.Errorf("heap grew by %d bytes, over %d for %d connections of 200 KiB bodies", grown, limit, maxConns)
	}
	// The connections over the cap were closed: reading one ends (EOF
	// or a reset) rather than waiting for an answer. The reads run at
	// once, each with a deadline generous enough for a loaded machine
	// to deliver the close (a 50 ms one missed a few under load): the
	// capped connections, which stall, wait it out together.
	var closed atomic.Int64
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() {
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err != nil {
				if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
					closed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if closed := int(closed.Load()); closed < conns-maxConns {
		t.Errorf("%d of %d connections closed by the server, want at least %d", closed, conns, conns-maxConns)
	}
	t.Logf("%d stalled connections, cap %d: peak accepted %d, %d closed (%d refused while sending); goroutines %d before, %d during; heap in use +%.1f MiB (limit %.1f MiB)",
		conns, maxConns, lst.Peak(), closed.Load(), refused, baseG, during, float64(grown)/(1<<20), float64(2*maxConns*stallLength+8<<20)/(1<<20))
}

// TestBigHeadersRefused: a request with about 1 MB of headers is answered
// 431 after at most maxHeaderBytes (and net/http's slack) are read, on
// every HTTP listener.
func TestBigHeadersRefused(t *testing.T) {
	srv := start(t, Config{AdminToken: "T"}, memstore.New())
	for name, addr := range map[string]string{"api": srv.Addr().String(), "admin": srv.AdminAddr().String()} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		go func() {
			fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: drip\r\n")
			for range 1000 {
				if _, err := fmt.Fprintf(c, "X-Pad: %s\r\n", strings.Repeat("p", 1000)); err != nil {
					return // the server answered and closed
				}
			}
			io.WriteString(c, "\r\n")
		}()
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := "HTTP/1.1 431 Request Header Fields Too Large"; strings.TrimSpace(line) != want {
			t.Errorf("%s: answered %q, want %q", name, strings.TrimSpace(line), want)
		}
	}
}

// TestGatewaySlowReaderCut: a client that asks the gateway for a large
// download and never reads it holds its connection, and an upstream
// connection, for no longer than Config.ReadTimeout once its receive
// window is full; then both are closed and the goroutines return.
func TestGatewaySlowReaderCut(t *testing.T) {
	const (
		readTimeout = time.Second      // what the test checks, injected
		generous    = 60 * time.Second // what it does not
	)
	upDone := make(chan error, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 32<<10)
		var err error
		for i := 0; i < (1<<30)/len(chunk) && err == nil; i++ { // up to 1 GiB
			_, err = w.Write(chunk)
		}
		upDone <- err
	}))
	t.Cleanup(up.Close)
	gw := start(t, Config{ReadTimeout: readTimeout, Upstream: up.URL, AdminListen: "off"}, memstore.New())
	base := runtime.NumGoroutine()

	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
	}}
	c, err := d.Dial("tcp", gw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: drip\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// Never read: the upstream's handler must end with a write error (its
	// connection closed by the gateway) rather than send the whole GiB.
	select {
	case err := <-upDone:
		if err == nil {
			t.Fatal("the upstream sent 1 GiB to a client that never read")
		}
	case <-time.After(generous):
		t.Fatalf("the upstream still writes %s after the client stopped reading (ReadTimeout %s)", generous, readTimeout)
	}
	cut := time.Since(start)
	deadline := time.Now().Add(generous)
	for runtime.NumGoroutine() > base+5 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after the slow reader was cut, %d before: %s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The client's connection was closed: reading it ends, in EOF or a
	// reset, after what was buffered.
	c.SetReadDeadline(time.Now().Add(generous))
	n, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the gateway kept the slow reader's connection open")
	}
	t.Logf("slow reader cut %.1fs after its request (ReadTimeout %s), %d bytes had reached it; goroutines %d before, %d after",
		cut.Seconds(), readTimeout, n, base, runtime.NumGoroutine())
}

// TestBodyCapFitsMultiTake: the largest body of use, a multi-take of 100
// requests each with an inline key of the longest length and a limit,
// fits well within maxBody and is read (not refused with 413).
func TestBodyCapFitsMultiTake(t *testing.T) {
	var reqs []string
	for i := range 100 {
		key := fmt.Sprintf("%03d%s", i, strings.Repeat("k", MaxInlineKeyLen-3))
		reqs = append(reqs, fmt.Sprintf(`{"key": "%s", "cost": 1, %s}`, key, lim))
	}
	body := `{"requests": [` + strings.Join(reqs, ", ") + `]}`
	if len(body) > maxBody*2/3 {
		t.Fatalf("a multi-take of 100 longest keys is %d bytes, too close to the cap %d", len(body), maxBody)
	}
	srv := start(t, Config{}, memstore.New())
	if code, resp := post(t, srv.base+"/v1/take", body); code == http.StatusRequestEntityTooLarge {
		t.Fatalf("a multi-take of %d bytes: %d %s", len(body), code, resp)
	}
	t.Logf("a multi-take of 100 inline keys of %d bytes: %d bytes, cap %d", MaxInlineKeyLen, len(body), maxBody)
}

// TestGatewaySteadyDownloadNotCut: a download that keeps moving, read in
// bursts with pauses well under Config.ReadTimeout, is never cut, however
// long it takes in all (here longer than the timeout).
func TestGatewaySteadyDownloadNotCut(t *testing.T) {
	const (
		readTimeout = 2 * time.Second // the idle bound; the pauses are a tenth of it
		size        = 12 << 20
		burst       = 1 << 20
	)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		chunk := make([]byte, 32<<10)
		for range size / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	t.Cleanup(up.Close)
	gw := start(t, Config{ReadTimeout: readTimeout, Upstream: up.URL, AdminListen: "off"}, memstore.New())
	resp, err := http.Get(gw.base + "/big")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	start := time.Now()
	got := 0
	for {
		n, err := io.CopyN(io.Discard, resp.Body, burst)
		got += int(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("download cut after %d of %d bytes (%s): %v", got, size, time.Since(start).Round(time.Millisecond), err)
		}
		time.Sleep(readTimeout / 10)
	}
	if got != size {
		t.Fatalf("got %d bytes, want %d", got, size)
	}
	t.Logf("%d MiB read in bursts of 1 MiB with pauses of %s took %.1fs (ReadTimeout %s), not cut",
		size>>20, readTimeout/10, time.Since(start).Seconds(), readTimeout)
}

// TestSlowHeadersDoNotShutOthersOut: a client that fills Config.MaxConnections
// with connections sending nothing, half their headers (slow loris), or
// the first bytes of a body, does not keep another client out of the
// decision API: the new connection closes the oldest of them and its
// request is answered.
func TestSlowHeadersDoNotShutOthersOut(t *testing.T) {
	for name, sent := range map[string]string{
		"nothing":          "",
		"half headers":     "POST /v1/take HTTP/1.1\r\nHost: drip\r\n",
		"a trickling body": "POST /v1/take HTTP/1.1\r\nHost: drip\r\nContent-Length: 1000\r\n\r\n{\"key\": ",
	} {
		t.Run(name, func(t *testing.T) { slowConnsAtCap(t, sent) })
	}
}

func slowConnsAtCap(t *testing.T, sent string) {
	const (
		maxConns = 16
		generous = 30 * time.Second
	)
	srv := start(t, Config{MaxConnections: maxConns, ReadTimeout: time.Minute, AdminListen: "off"}, memstore.New())
	lst := srv.cappedListener(t, "api")
	var slow []net.Conn
	for range maxConns {
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, sent); err != nil {
			t.Fatal(err)
		}
		slow = append(slow, c)
	}
	deadline := time.Now().Add(generous)
	for lst.Open() < maxConns {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open, want the cap %d", lst.Open(), maxConns)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // their handlers started, when they will

	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(generous))
	body := `{"key": "k", "limit": {"rate": 5}}`
	fmt.Fprintf(c, "POST /v1/take HTTP/1.1\r\nHost: drip\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a request at the cap, the cap held by slow connections: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	// The oldest slow connection made room for it.
	slow[0].SetReadDeadline(time.Now().Add(generous))
	if _, err := slow[0].Read(make([]byte, 1)); err == nil {
		t.Error("the oldest slow connection got an answer, want it closed")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Errorf("the oldest slow connection is still open after %s", generous)
	}
	if p := lst.Peak(); p > maxConns {
		t.Errorf("%d connections open at once, cap %d", p, maxConns)
	}
}
