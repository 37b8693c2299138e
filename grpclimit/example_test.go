package grpclimit_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/grpclimit"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// The interceptors in a gRPC server: a per-API-key token bucket of 1 call
// a minute with bursts of 2, in the memory store, for every method.
func Example() {
	set, err := rules.Parse([]byte(`{"rules": [
		{"name": "per-key", "limit_keys": ["header:x-api-key"],
		 "algorithm_config": {"rate": 1, "period": "1m", "burst": 2}}]}`), "rules.json")
	if err != nil {
		log.Fatal(err)
	}
	store := memstore.New()
	defer store.Close()
	lim := grpclimit.New(store, set)
	defer lim.Close()

	srv := grpc.NewServer(grpc.UnaryInterceptor(lim.UnaryInterceptor()), grpc.StreamInterceptor(lim.StreamInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer()) // your services here
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k1")
	for range 3 {
		var md metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
		st := status.Convert(err)
		retry := false
		for _, d := range st.Details() {
			_, ok := d.(*errdetails.RetryInfo)
			retry = retry || ok
		}
		fmt.Println(st.Code(), md.Get("ratelimit-policy"), md.Get("ratelimit-remaining"), "RetryInfo:", retry)
	}
	// Output:
	// OK ["per-key";q=2;w=120] [1] RetryInfo: false
	// OK ["per-key";q=2;w=120] [0] RetryInfo: false
	// ResourceExhausted ["per-key";q=2;w=120] [0] RetryInfo: true
}
