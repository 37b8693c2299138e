package memstore_test

import (
	"context"
	"testing"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/memstore"
)

// BenchmarkTakeHotKey is one key through the Limiter, the path users call.
func BenchmarkTakeHotKey(b *testing.B) {
	s := memstore.New()
	defer s.Close()
	l := drip.New(s, drip.PerSecond(100))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		l.Take(ctx, "hot")
	}
}
