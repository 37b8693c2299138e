package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TLS files (certificates, keys, CAs) named by envoyproxy/ratelimit's
// variables are read again when they change (a Kubernetes Secret rotated
// under a running pod), checked at most once a second, when a handshake
// asks. A change that does not load keeps what is in force: it is logged
// and counted in drip_tls_reloads_total{files, result="error"}, once per
// change.

// tlsReloads is what every watched file set shares: the clock, the log
// and the counter.
type tlsReloads struct {
	now   func() time.Time // time.Now; tests set it
	log   *slog.Logger     // set once the logger exists, before serving; nil: not logged
	count *prometheus.CounterVec
	names []string // the variables watched, in order
}

func newTLSReloads() *tlsReloads {
	return &tlsReloads{now: time.Now, count: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drip_tls_reloads_total",
		Help: "Reloads of TLS files that changed (certificates, keys, CAs), by the variable naming them and result: ok, or error (the files in force are kept).",
	}, []string{"files", "result"})}
}

// watched is a value read from files, read again when their content
// changes.
type watched[T any] struct {
	name  string // the variable that names the files: for logs and the metric
	files []string
	load  func() (T, error)
	r     *tlsReloads

	mu      sync.Mutex
	v       T
	loaded  bool
	sig     string // of the files last read, loaded or not
	checked time.Time
}

// watch loads files with load and keeps them watched; an error is the
// first load's.
func watch[T any](r *tlsReloads, name string, load func() (T, error), files ...string) (*watched[T], error) {
	w := &watched[T]{name: name, files: files, load: load, r: r}
	if _, err := w.get(); err != nil {
		return nil, err
	}
	r.names = append(r.names, name)
	for _, res := range []string{"ok", "error"} {
		r.count.WithLabelValues(name, res) // 0 from the start
	}
	return w, nil
}

// get returns the value in force, reading the files again first if a
// second has passed since they were last checked and their content
// changed.
func (w *watched[T]) get() (T, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.r.now()
	if d := now.Sub(w.checked); w.loaded && d >= 0 && d < time.Second {
		return w.v, nil
	}
	w.checked = now
	sig, err := fileSig(w.files...)
	if err == nil {
		if w.loaded && sig == w.sig {
			return w.v, nil
		}
		var v T
		if v, err = w.load(); err == nil {
			if w.loaded {
				w.r.count.WithLabelValues(w.name, "ok").Inc()
				w.logf(slog.LevelInfo, "drip serve: TLS files reloaded", nil)
			}
			w.v, w.loaded, w.sig = v, true, sig
			return v, nil
		}
	} else {
		sig = "unreadable: " + err.Error()
	}
	if !w.loaded {
		return w.v, err
	}
	if sig != w.sig { // once per change
		w.sig = sig
		w.r.count.WithLabelValues(w.name, "error").Inc()
		w.logf(slog.LevelWarn, "drip serve: TLS files changed but do not load; the ones in force are kept", err)
	}
	return w.v, nil
}

func (w *watched[T]) logf(level slog.Level, msg string, err error) {
	if w.r.log == nil {
		return
	}
	args := []any{"variable", w.name, "files", w.files}
	if err != nil {
		args = append(args, "err", err)
	}
	w.r.log.Log(context.Background(), level, msg, args...)
}

// keyPair watches a certificate and its key.
func keyPair(r *tlsReloads, name, cert, key string) (*watched[*tls.Certificate], error) {
	return watch(r, name, func() (*tls.Certificate, error) {
		kp, err := tls.LoadX509KeyPair(cert, key)
		return &kp, err
	}, cert, key)
}

// caPool watches a file of PEM CA certificates.
func caPool(r *tlsReloads, name, file string) (*watched[*x509.CertPool], error) {
	return watch(r, name, func() (*x509.CertPool, error) { return certPool(file) }, file)
}

func certPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", file)
	}
	return pool, nil
}

// maxTLSFile bounds what fileSig reads of a file.
const maxTLSFile = 1 << 20

// fileSig is a digest of the files' content: a file rewritten within the
// filesystem's timestamp granularity, at the same size, still differs.
func fileSig(names ...string) (string, error) {
	h := sha256.New()
	for _, n := range names {
		f, err := os.Open(n)
		if err != nil {
			return "", err
		}
		c, err := io.Copy(h, io.LimitReader(f, maxTLSFile+1))
		f.Close()
		if err != nil {
			return "", err
		}
		if c > maxTLSFile {
			return "", errors.New(n + ": over 1 MiB, not a certificate, key or CA file")
		}
		h.Write([]byte{0})
	}
	return string(h.Sum(nil)), nil
}
