package bench

import (
	"net"
	"net/url"
	"testing"
	"time"
)

// BenchmarkLeasedPgBouncerFar is BenchmarkLeasedPgBouncer with the
// pooler 10 ms away each way (a proxy in the process that holds every
// chunk of bytes 10 ms before passing it on): round trips of 20 ms or
// more whatever the machine's load, where a round trip refills more
// tokens of the saturated key (200 a second) than one probe per instance
// takes:
//
//	cd bench && go test -run '^$' -bench 'LeasedPgBouncerFar' -benchtime 2s
func BenchmarkLeasedPgBouncerFar(b *testing.B) {
	benchLeasedPgBouncer(b, "leasedfar", 10*time.Millisecond)
}

// farURL is raw with its host replaced by a proxy's, started for b, that
// passes each chunk of bytes on delay after it came, in order.
func farURL(b *testing.B, raw string, delay time.Duration) string {
	u, err := url.Parse(raw)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	to := u.Host
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			go late(s, c, delay)
			go late(c, s, delay)
		}
	}()
	u.Host = ln.Addr().String()
	return u.String()
}

// late copies src to dst, each chunk delay after it was read, and closes
// both at the end.
func late(dst, src net.Conn, delay time.Duration) {
	type chunk struct {
		at time.Time
		b  []byte
	}
	ch := make(chan chunk, 4096)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{time.Now().Add(delay), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}
