package grpclimit_test

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/grpclimit"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// headerSink is the server stream of a call, as far as grpc.SetHeader
// needs one.
type headerSink struct{ md metadata.MD }

func (s *headerSink) Method() string                  { return "/pkg.Service/Method" }
func (s *headerSink) SetHeader(md metadata.MD) error  { s.md = md; return nil }
func (s *headerSink) SendHeader(md metadata.MD) error { s.md = md; return nil }
func (s *headerSink) SetTrailer(metadata.MD) error    { return nil }

// BenchmarkUnary measures the unary interceptor's own cost per call on
// the memory store (no network): the built-in default rules (one enforce
// rule per IP, one shadow rule), over 1000 peers.
func BenchmarkUnary(b *testing.B) {
	ms := memstore.New()
	defer ms.Close()
	l := grpclimit.New(ms, rules.Default(), engine.WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	intercept := l.UnaryInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/pkg.Service/Method"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	ctxs := make([]context.Context, 1000)
	for i := range ctxs {
		addr := &net.TCPAddr{IP: net.IPv4(10, 0, byte(i/250), byte(i%250)), Port: 1234}
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: addr})
		ctx = grpc.NewContextWithServerTransportStream(ctx, &headerSink{})
		ctxs[i] = metadata.NewIncomingContext(ctx, metadata.Pairs("x-api-key", "k", "user-agent", "bench"))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		intercept(ctxs[i%len(ctxs)], nil, info, handler)
	}
}
