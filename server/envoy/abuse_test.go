package envoy

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/driplimit/drip/store/memstore"
)

// h2Client speaks just enough HTTP/2 to open calls that never send their
// request: the connection preface, then HEADERS frames, never DATA. It
// counts the streams the server refuses (RST_STREAM) and notes when the
// server closes the connection.
type h2Client struct {
	conn    net.Conn
	mu      sync.Mutex
	resets  int
	changed chan struct{} // closed and replaced on every reset, and at EOF
	closed  bool
}

func dialH2(t *testing.T, addr string) *h2Client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := &h2Client{conn: c, changed: make(chan struct{})}
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err == nil {
		_ = h.frame(0x4, 0, 0, nil) // an empty SETTINGS
	}
	go h.read()
	return h
}

// frame writes one HTTP/2 frame.
func (h *h2Client) frame(typ, flags byte, stream uint32, payload []byte) error {
	hdr := make([]byte, 9, 9+len(payload))
	hdr[0], hdr[1], hdr[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	hdr[3], hdr[4] = typ, flags
	binary.BigEndian.PutUint32(hdr[5:], stream)
	_, err := h.conn.Write(append(hdr, payload...))
	return err
}

// open starts n calls to ShouldRateLimit (streams 1, 3, 5, ...) with
// their headers only.
func (h *h2Client) open(n int) {
	var block []byte
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "drip"},
		{":path", "/" + ServiceName + "/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		// HPACK: a literal header field without indexing, new name, no
		// Huffman coding (every length here is under 127).
		block = append(block, 0, byte(len(f[0])))
		block = append(block, f[0]...)
		block = append(block, byte(len(f[1])))
		block = append(block, f[1]...)
	}
	w := bufio.NewWriter(h.conn)
	for i := range n {
		hdr := [9]byte{byte(len(block) >> 16), byte(len(block) >> 8), byte(len(block)), 0x1, 0x4}
		binary.BigEndian.PutUint32(hdr[5:], uint32(2*i+1))
		w.Write(hdr[:])
		w.Write(block)
	}
	w.Flush() // an error here is a connection the server closed: read sees it
}

func (h *h2Client) read() {
	r := bufio.NewReader(h.conn)
	var hdr [9]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			break
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		if _, err := r.Discard(n); err != nil {
			break
		}
		if hdr[3] == 0x3 { // RST_STREAM
			h.mu.Lock()
			h.resets++
			close(h.changed)
			h.changed = make(chan struct{})
			h.mu.Unlock()
		}
	}
	h.mu.Lock()
	h.closed = true
	close(h.changed)
	h.mu.Unlock()
}

// waitFor waits until the server has refused resets streams or closed the
// connection, and reports whether it closed it.
func (h *h2Client) waitFor(t *testing.T, resets int, deadline time.Time) bool {
	t.Helper()
	for {
		h.mu.Lock()
		n, closed, ch := h.resets, h.closed, h.changed
		h.mu.Unlock()
		if closed {
			return true
		}
		if n >= resets {
			return false
		}
		select {
		case <-ch:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("the server refused %d streams of a connection, want %d, and kept it open", n, resets)
		}
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// stalledServer serves the README config with limits lim on a free port
// until the test ends.
func stalledServer(t *testing.T, lim Limits) string {
	t.Helper()
	srv := NewServerWithLimits(NewService(memstore.New(), loadReadme(t)), false, lim)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.GRPC.Stop()
		<-served
	})
	return ln.Addr().String()
}

// TestStalledStreamsBounded is the attack of 30 connections opening
// HTTP/2 streams that never send DATA (300,000 streams had made 287,363
// goroutines and 3.3 GB): connections beyond MaxConnections are closed,
// streams beyond MaxConcurrentStreams refused, so goroutines and memory
// stay bounded by the limits whatever the client sends.
func TestStalledStreamsBounded(t *testing.T) {
	const (
		conns, streams   = 30, 300
		maxConns         = 8
		maxStreams       = 16
		perConnOverhead  = 8 // gRPC's reader, writer, keepalive... per connection, generously
		testReaders      = conns
		generousDeadline = 60 * time.Second
	)
	// The age limits are far off: no connection ends during the test, so
	// which ones the server keeps is certain (the first maxConns).
	addr := stalledServer(t, Limits{MaxConnections: maxConns, MaxConcurrentStreams: maxStreams, MaxConnectionAge: time.Hour})
	baseG, baseHeap := runtime.NumGoroutine(), heapInUse()

	deadline := time.Now().Add(generousDeadline)
	kept := 0
	for range conns {
		c := dialH2(t, addr)
		c.open(streams)
		if !c.waitFor(t, streams-maxStreams, deadline) {
			kept++
		}
	}
	if kept != maxConns {
		t.Fatalf("the server kept %d of %d connections, want MaxConnections = %d", kept, conns, maxConns)
	}
	g, heap := runtime.NumGoroutine(), heapInUse()
	t.Logf("%d connections x %d stalled streams: %d connections kept, goroutines %d -> %d, heap in use %.1f -> %.1f MB",
		conns, streams, kept, baseG, g, float64(baseHeap)/1e6, float64(heap)/1e6)
	if bound := baseG + maxConns*(maxStreams+perConnOverhead) + testReaders; g > bound {
		t.Errorf("%d goroutines with %d stalled streams open, want at most %d", g, conns*streams, bound)
	}
	if heap > baseHeap+64<<20 {
		t.Errorf("heap in use grew by %.1f MB, want under 64 MB", float64(heap-baseHeap)/1e6)
	}
}

// TestStalledStreamsCut: once MaxConnectionAge + MaxConnectionAgeGrace
// pass, the connection of stalled calls is closed, and every goroutine
// they held is gone.
func TestStalledStreamsCut(t *testing.T) {
	const (
		conns, streams = 2, 16
		generous       = 60 * time.Second
	)
	addr := stalledServer(t, Limits{MaxConnectionAge: time.Second, MaxConnectionAgeGrace: time.Second})
	baseG := runtime.NumGoroutine()
	deadline := time.Now().Add(generous)
	start := time.Now()
	cs := make([]*h2Client, conns)
	for i := range cs {
		cs[i] = dialH2(t, addr)
		cs[i].open(streams)
	}
	for _, c := range cs {
		if !c.waitFor(t, streams+1, deadline) { // never that many resets: until closed
			t.Fatal("connection still open")
		}
	}
	cut := time.Since(start)
	for runtime.NumGoroutine() > baseG {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after the stalled connections were closed, want %d as before", runtime.NumGoroutine(), baseG)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d connections x %d stalled streams closed after %.1fs (age 1s + grace 1s); goroutines back to %d",
		conns, streams, cut.Seconds(), runtime.NumGoroutine())
}

// TestLongDescriptorValues: a descriptor value far over store.MaxKeyLen
// (a long path, say) is limited under a hashed key of its own, never
// refused (a refusal would let Envoy's failure mode decide), and two long
// values that differ only at their end stay apart.
func TestLongDescriptorValues(t *testing.T) {
	r := serve(t, memstore.New(), loadReadme(t), false)
	long := strings.Repeat("1", 10_000)
	for _, v := range []string{long + "a", long + "b"} {
		for i := range 11 {
			resp := r.call(t, "edge_proxy_per_ip", 1, desc("remote_address="+v))
			want := rlsv3.RateLimitResponse_OK
			if i == 10 {
				want = rlsv3.RateLimitResponse_OVER_LIMIT // 10 a second
			}
			if resp.OverallCode != want {
				t.Fatalf("call %d on a %d-byte value: %v, want %v", i, len(v), resp.OverallCode, want)
			}
		}
	}
}
