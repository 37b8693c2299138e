package grpclimit

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
)

// watched is what a call's handler sent back, for the rules settled when
// it ends (cost_from_response, count_status): its header and trailer
// metadata, however the handler set them (grpc.SetHeader, SendHeader and
// SetTrailer on its context, or on its stream).
type watched struct {
	mu              sync.Mutex
	header, trailer metadata.MD
}

func (w *watched) add(trailer bool, md metadata.MD) {
	w.mu.Lock()
	defer w.mu.Unlock()
	dst := &w.header
	if trailer {
		dst = &w.trailer
	}
	*dst = metadata.Join(*dst, md)
}

// response is the call's end as the engine settles it: its status as an
// HTTP status (HTTPStatus), and its header or trailer metadata.
func (w *watched) response(err error) engine.Response {
	return engine.Response{Status: HTTPStatus(status.Code(err)), Value: func(src rules.ResponseSource) (string, bool) {
		w.mu.Lock()
		defer w.mu.Unlock()
		md := w.header
		if src.Trailer {
			md = w.trailer
		}
		if v := md.Get(strings.ToLower(src.Name)); len(v) > 0 {
			return v[0], true
		}
		return "", false
	}}
}

// transport watches what the handler sets through its context.
type transport struct {
	grpc.ServerTransportStream
	w *watched
}

func (t transport) SetHeader(md metadata.MD) error {
	t.w.add(false, md)
	return t.ServerTransportStream.SetHeader(md)
}

func (t transport) SendHeader(md metadata.MD) error {
	t.w.add(false, md)
	return t.ServerTransportStream.SendHeader(md)
}

func (t transport) SetTrailer(md metadata.MD) error {
	t.w.add(true, md)
	return t.ServerTransportStream.SetTrailer(md)
}

// context is ctx with the call's transport stream watched (none: ctx).
func (w *watched) context(ctx context.Context) context.Context {
	sts := grpc.ServerTransportStreamFromContext(ctx)
	if sts == nil {
		return ctx
	}
	return grpc.NewContextWithServerTransportStream(ctx, transport{sts, w})
}

// stream watches what a streaming handler sets on its stream.
type stream struct {
	grpc.ServerStream
	w   *watched
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }

func (s *stream) SetHeader(md metadata.MD) error {
	s.w.add(false, md)
	return s.ServerStream.SetHeader(md)
}

func (s *stream) SendHeader(md metadata.MD) error {
	s.w.add(false, md)
	return s.ServerStream.SendHeader(md)
}

func (s *stream) SetTrailer(md metadata.MD) {
	s.w.add(true, md)
	s.ServerStream.SetTrailer(md)
}

// HTTPStatus returns the HTTP status a gRPC code stands for, as Google's
// APIs map them: OK 200, InvalidArgument 400, NotFound 404,
// ResourceExhausted 429, Canceled 499, Unavailable 503, and so on. A
// count_status rule matches it on a gRPC call.
func HTTPStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return 200
	case codes.Canceled:
		return 499
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return 400
	case codes.DeadlineExceeded:
		return 504
	case codes.NotFound:
		return 404
	case codes.AlreadyExists, codes.Aborted:
		return 409
	case codes.PermissionDenied:
		return 403
	case codes.ResourceExhausted:
		return 429
	case codes.Unimplemented:
		return 501
	case codes.Unavailable:
		return 503
	case codes.Unauthenticated:
		return 401
	}
	return 500 // Unknown, Internal, DataLoss, and codes gRPC may add
}
