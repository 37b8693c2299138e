package simulate_test

import (
	"context"
	"fmt"
	"os"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/simulate"
)

// The worked example: 10 tokens per second, bursts of 50, and a
// client that sends 60 requests per second from a full bucket.
func Example() {
	p, err := simulate.ParsePattern("60/s for 4s")
	if err != nil {
		panic(err)
	}
	limit := drip.PerSecond(10).WithBurst(50)
	res, err := simulate.Run(context.Background(), p.Arrivals(simulate.Arrival{Cost: 1}), simulate.Options{Limit: limit, End: p.Duration()})
	if err != nil {
		panic(err)
	}
	fmt.Println("first denial: request", res.FirstDenial.N)
	res.WriteSummary(os.Stdout, p.String())
	// Output:
	// first denial: request 60
	// limit           10/1s burst 50
	// traffic         60/s for 4s
	// requests        240 over 4s, 1 key
	// accepted        89 (37.1%), 22.2/s
	// denied          151 (62.9%)
	// first denial    request 60 at 0.983s: 0.83 tokens left, retry after 0.017s (Retry-After: 1)
	// steady state    16.7% accepted, 10.0/s (from 2s to the end at 4s)
	// longest retry   0.083s (Retry-After: 1), request 62 at 1.017s
	//
	// time (s)          sent  accepted   denied  accepted%  tokens at end
	// 0-1                 60        59        1      98.3%  1.00
	// 1-2                 60        10       50      16.7%  1.00
	// 2-3                 60        10       50      16.7%  1.00
	// 3-4                 60        10       50      16.7%  1.00
}
