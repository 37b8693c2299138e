// Package xds is the xDS client of drip's Envoy rate limit service: it
// follows a control plane's RateLimitConfig resources
// (type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig)
// over an aggregated state-of-the-world stream, as envoyproxy/ratelimit
// does under CONFIG_TYPE=GRPC_XDS_SOTW and as Envoy Gateway serves them.
//
// Each response is one whole snapshot: its resources become
// envoyproxy/ratelimit config files (Files) and go to the Client's Apply,
// which parses and swaps them in at once (or refuses them); the client
// then ACKs the snapshot's version, or NACKs it with Apply's error and
// keeps the version in force. A stream that fails or ends is opened again
// after a backoff (Backoff), asking for the version in force.
package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/driplimit/drip/server/envoy"
)

// TypeURL is the type of the resources the client asks for.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// MaxMessage bounds one response of the xDS server (all its resources):
// a larger one ends the stream with an error, and the client reconnects.
const MaxMessage = 16 << 20

// Backoff is how long the client waits before it opens a stream again
// after one failed or ended: Initial the first time, doubling each time
// after, at most Max; with Jitter, each wait is multiplied by a random
// factor between 1-RandomFactor and 1+RandomFactor (and still at most
// Max). A stream that got a response starts the sequence over.
type Backoff struct {
	Initial, Max time.Duration
	RandomFactor float64
	Jitter       bool
}

// DefaultBackoff is envoyproxy/ratelimit's: 10 s, then up to 60 s, ±50%.
var DefaultBackoff = Backoff{Initial: 10 * time.Second, Max: 60 * time.Second, RandomFactor: 0.5, Jitter: true}

// wait is the n-th wait (n from 0).
func (b Backoff) wait(n int, rnd func() float64) time.Duration {
	d := b.Initial
	for i := 0; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if b.Jitter && b.RandomFactor > 0 {
		f := 1 - b.RandomFactor + 2*b.RandomFactor*rnd()
		d = min(time.Duration(float64(d)*f), b.Max)
	}
	return max(d, 0)
}

// Config is how the client reaches its xDS server.
type Config struct {
	// Server is the xDS server's address, host:port (a gRPC target).
	Server string
	// NodeID is the node the client says it is: the server sends the
	// snapshot it keeps for this node.
	NodeID string
	// NodeMetadata goes in the node's metadata, as strings.
	NodeMetadata map[string]string
	// Headers are sent as gRPC metadata when each stream opens.
	Headers map[string]string
	// TLS, when set, secures the connection (with a client certificate
	// for mutual TLS when it holds one); nil connects in plaintext.
	TLS *tls.Config
	// RootCAs, when set with TLS, gives the CAs the server's certificate
	// must chain to, read at each connection in place of TLS.RootCAs: a
	// CA file that rotates is followed without a restart.
	RootCAs func() (*x509.CertPool, error)
	// Backoff is the wait between streams; zero fields take
	// DefaultBackoff's.
	Backoff Backoff
	// Logger receives the client's logs (default slog.Default()).
	Logger *slog.Logger
}

// Apply takes a snapshot: version is its version, files its resources as
// envoyproxy/ratelimit config files, in the server's order. An error
// refuses it (a NACK with the error's text): the configuration in force
// must then stay.
type Apply func(version string, files []envoy.File) error

// Client follows one xDS server. Construct it with New and call Run.
type Client struct {
	cfg   Config
	apply Apply
	log   *slog.Logger
	conn  *grpc.ClientConn
	rnd   func() float64
	after func(time.Duration) <-chan time.Time // time.After; tests set their own

	mu      sync.Mutex
	version string // of the snapshot in force; "" before the first
	first   chan struct{}
	once    sync.Once
}

// New returns a client of the server cfg names; it connects when Run
// runs.
func New(cfg Config, apply Apply) (*Client, error) {
	if cfg.Server == "" {
		return nil, errors.New("xds: no server address")
	}
	if cfg.NodeID == "" {
		return nil, errors.New("xds: no node ID")
	}
	b := &cfg.Backoff
	if b.Initial <= 0 {
		b.Initial = DefaultBackoff.Initial
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoff.Max
	}
	b.Max = max(b.Max, b.Initial)
	if b.RandomFactor < 0 || b.RandomFactor > 1 {
		return nil, fmt.Errorf("xds: backoff random factor %v: want 0 to 1", b.RandomFactor)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	creds := insecure.NewCredentials()
	switch {
	case cfg.TLS != nil && cfg.RootCAs != nil:
		creds = &rootsEachConn{TransportCredentials: credentials.NewTLS(cfg.TLS), cfg: cfg.TLS, roots: cfg.RootCAs}
	case cfg.TLS != nil:
		creds = credentials.NewTLS(cfg.TLS)
	}
	conn, err := grpc.NewClient(cfg.Server, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessage)))
	if err != nil {
		return nil, fmt.Errorf("xds: %w", err)
	}
	return &Client{cfg: cfg, apply: apply, log: cfg.Logger, conn: conn, rnd: rand.Float64, after: time.After, first: make(chan struct{})}, nil
}

// rootsEachConn are TLS credentials whose root CAs are read at each
// connection (Config.RootCAs).
type rootsEachConn struct {
	credentials.TransportCredentials
	cfg   *tls.Config
	roots func() (*x509.CertPool, error)
}

func (r *rootsEachConn) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	pool, err := r.roots()
	if err != nil {
		return nil, nil, err
	}
	c := r.cfg.Clone()
	c.RootCAs = pool
	return credentials.NewTLS(c).ClientHandshake(ctx, authority, conn)
}

func (r *rootsEachConn) Clone() credentials.TransportCredentials {
	return &rootsEachConn{TransportCredentials: r.TransportCredentials.Clone(), cfg: r.cfg, roots: r.roots}
}

// Applied is closed once a first snapshot has been applied.
func (c *Client) Applied() <-chan struct{} { return c.first }

// Version is the version of the snapshot in force, "" before the first.
func (c *Client) Version() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

// Run follows the server until ctx ends, opening a stream again after
// each failure; it closes the connection when it returns.
func (c *Client) Run(ctx context.Context) {
	defer c.conn.Close()
	for n := 0; ; {
		got, err := c.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if got {
			n = 0
		}
		d := c.cfg.Backoff.wait(n, c.rnd)
		n++
		c.log.Warn("xds: stream to the configuration server ended; opening it again", "server", c.cfg.Server, "err", err, "in", d.String())
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// stream runs one stream until it fails; got says whether it received
// any response.
func (c *Client) stream(ctx context.Context) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for k, v := range c.cfg.Headers {
		ctx = metadata.AppendToOutgoingContext(ctx, k, v)
	}
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(c.conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	node := c.node()
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeURL, VersionInfo: c.Version()}); err != nil {
		return false, err
	}
	resps, recvErr := c.receive(ctx, st)
	nacked, nackErr := "", error(nil) // the version last refused on this stream, and why
	repeats := 0                      // how many times since it came again
	var held *discoveryv3.DiscoveryRequest
	var due <-chan time.Time // when held is sent
	for {
		var resp *discoveryv3.DiscoveryResponse
		select {
		case err := <-recvErr:
			return got, err
		case <-due:
			if err := st.Send(held); err != nil {
				return got, err
			}
			held, due = nil, nil
			continue
		case resp = <-resps:
		}
		got = true
		held, due = nil, nil // a response answers the one before, held back or not
		req := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeURL, ResponseNonce: resp.Nonce}
		repeat := nackErr != nil && resp.VersionInfo == nacked
		err = nackErr
		if !repeat {
			err = c.take(resp) // a version refused already is not read again
		}
		if err != nil {
			// A NACK names the version in force, as the protocol asks.
			// A server that answers it by sending the refused version
			// again (go-control-plane's snapshot cache, which Envoy
			// Gateway uses, resends whatever differs from the version a
			// request names) would loop with the client, thousands of
			// times a second; the second NACK of a version names that
			// version, which such a server takes as the client's and
			// waits for a new snapshot. A server that sends it again
			// still gets each further NACK after a backoff (Backoff, from
			// Initial to Max), and a new version at once.
			req.VersionInfo = c.Version()
			if repeat {
				req.VersionInfo = resp.VersionInfo
				repeats++
			} else {
				repeats = 0
				c.log.Error("xds: configuration refused (NACK); the one in force stays", "version", resp.VersionInfo, "err", err.Error())
			}
			nacked, nackErr = resp.VersionInfo, err
			req.ErrorDetail = &spb.Status{Code: int32(codes.InvalidArgument), Message: truncate(err.Error(), maxDetail)}
		} else {
			nacked, nackErr, repeats = "", nil, 0
			c.log.Info("xds: configuration applied", "version", resp.VersionInfo, "resources", len(resp.Resources))
			req.VersionInfo = resp.VersionInfo
		}
		if repeats >= 2 {
			d := c.cfg.Backoff.wait(repeats-2, c.rnd)
			if repeats == 2 {
				c.log.Warn("xds: the server sends a refused configuration again after each NACK; answering it after a backoff", "version", resp.VersionInfo, "in", d.String())
			}
			held, due = req, c.after(d)
			continue
		}
		if err := st.Send(req); err != nil {
			return got, err
		}
	}
}

// receive reads the stream's responses into resps until it fails (the
// error in recvErr) or ctx ends, so that the stream can wait to send a
// NACK while it reads.
func (c *Client) receive(ctx context.Context, st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient) (resps <-chan *discoveryv3.DiscoveryResponse, recvErr <-chan error) {
	rc, ec := make(chan *discoveryv3.DiscoveryResponse), make(chan error, 1)
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				ec <- err
				return
			}
			select {
			case rc <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return rc, ec
}

// take applies one response, and records its version if it applied.
func (c *Client) take(resp *discoveryv3.DiscoveryResponse) error {
	if resp.TypeUrl != TypeURL {
		return fmt.Errorf("response of type %q: want %s", resp.TypeUrl, TypeURL)
	}
	cfgs := make([]*rlconfv3.RateLimitConfig, len(resp.Resources))
	for i, r := range resp.Resources {
		if r.GetTypeUrl() != TypeURL {
			return fmt.Errorf("resources[%d]: type %q: want %s", i, r.GetTypeUrl(), TypeURL)
		}
		cfgs[i] = new(rlconfv3.RateLimitConfig)
		if err := r.UnmarshalTo(cfgs[i]); err != nil {
			return fmt.Errorf("resources[%d]: %w", i, err)
		}
	}
	files, err := Files(cfgs)
	if err != nil {
		return err
	}
	if err := c.apply(resp.VersionInfo, files); err != nil {
		return err
	}
	c.mu.Lock()
	c.version = resp.VersionInfo
	c.mu.Unlock()
	c.once.Do(func() { close(c.first) })
	return nil
}

func (c *Client) node() *corev3.Node {
	n := &corev3.Node{Id: c.cfg.NodeID, UserAgentName: "drip"}
	if len(c.cfg.NodeMetadata) > 0 {
		fields := map[string]*structpb.Value{}
		for k, v := range c.cfg.NodeMetadata {
			fields[k] = structpb.NewStringValue(v)
		}
		n.Metadata = &structpb.Struct{Fields: fields}
	}
	return n
}

// maxDetail bounds the error text of a NACK (a snapshot with many
// problems lists them all in the log).
const maxDetail = 4 << 10

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
