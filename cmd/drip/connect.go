package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/rueidis"

	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/pending"
	"github.com/driplimit/drip/store/redisstore"
)

// startWait is how long drip serve waits for its store to answer at
// start before it starts without it (a server that accepts connections
// but does not answer, paused or swamped, holds an attempt for seconds:
// the probes of the listeners that are not up yet would fail meanwhile).
const startWait = 2 * time.Second

// openServeStore opens drip serve's store. A store that does not answer
// (storeDown, or no answer within startWait) does not stop drip from
// starting: the store is then a pending.Store, whose calls fail as a
// store that is down fails (each rule's on_error decides) while it
// connects in the background, logging each attempt. A store that
// answers at once and refuses (a wrong password, a certificate not
// trusted, a schema to migrate), or a URL that is not valid, is an
// error: no outage that waiting cures.
func openServeStore(ctx context.Context, url string, log *slog.Logger, redisOpts ...redisstore.Option) (store.Store, func(), error) {
	type opened struct {
		st    store.Store
		close func()
		err   error
	}
	first := make(chan opened, 1)
	go func(c chan<- opened) {
		st, closeStore, err := openStore(ctx, url, redisOpts...)
		c <- opened{st, closeStore, err}
	}(first)
	t := time.NewTimer(startWait)
	defer t.Stop()
	var why string
	select {
	case o := <-first:
		if o.err == nil || !storeDown(o.err) {
			return o.st, o.close, o.err
		}
		first, why = nil, o.err.Error()
	case <-t.C:
		why = "no answer within " + startWait.String() + " (still trying)"
	}
	log.Warn("drip serve: the store does not answer; starting without it: each rule's on_error decides until it does, /readyz says whether the rules can serve meanwhile, and drip connects in the background", "err", why)
	open := func(actx context.Context) (store.Store, func(), error) {
		if c := first; c != nil { // the attempt under way at start
			first = nil // open runs on one goroutine
			select {
			case o := <-c:
				return o.st, o.close, o.err
			case <-actx.Done():
				go func() { // the store it opens, if any, is not used
					if o := <-c; o.err == nil {
						o.close()
					}
				}()
				return nil, nil, actx.Err()
			}
		}
		return openStore(actx, url, redisOpts...)
	}
	p := pending.New(capsOf(url), open, pending.DefaultBackoff, log)
	return p, func() { p.Close() }, nil
}

// capsOf is what the store of url can do, before it is open: what the
// store reports once open (TestServeStoreDown holds them to it), but
// SplitsKeys, which only a Redis Cluster sets: a redis:// URL may name
// one, and store.Separately only falls back when the store refuses a
// call's keys.
func capsOf(url string) store.Caps {
	c := store.Caps{Name: "redisstore", Leases: true, Sliding: true, Calendar: true, Blocks: true}
	c.SplitsKeys = strings.HasPrefix(url, "redis://") || strings.HasPrefix(url, "rediss://")
	if strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://") {
		c.Name = "pgstore"
	}
	return c
}

// storeDown reports whether err says the store did not answer (a
// connection refused, reset or timed out, a name that did not resolve,
// a server still loading its data or starting up, a cluster or Sentinel
// set that knows no node to serve), rather than that it answered and
// refused.
func storeDown(err error) bool {
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		// Connection exceptions, insufficient resources (too many
		// connections), operator intervention (starting up, shutting
		// down, crash recovery).
		switch pe.Code[:min(2, len(pe.Code))] {
		case "08", "53", "57":
			return true
		}
		return false
	}
	if re, ok := errors.AsType[*rueidis.RedisError](err); ok {
		msg := re.Error()
		for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return false
	}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return false
	}
	if _, ok := errors.AsType[x509.HostnameError](err); ok {
		return false
	}
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		return false // TLS to a server that does not speak it
	}
	if _, ok := errors.AsType[*fs.PathError](err); ok {
		return false // a file the URL names (tls_ca_file=...) that cannot be read
	}
	if _, ok := errors.AsType[*net.AddrError](err); ok {
		return false // not an address (an unknown port, say)
	}
	if _, ok := errors.AsType[*url.Error](err); ok {
		return false // a URL that does not parse (a net.Error too)
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	for _, e := range []error{io.EOF, io.ErrUnexpectedEOF, syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE,
		context.DeadlineExceeded, rueidis.ErrClosing, rueidis.ErrNoAddr, rueidis.ErrNoSlot} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
