package topkeys

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
)

// DenialLog is the log of denials (WithDenialLog): at most one line per
// rule every Every (the first denial after a quiet Every: a sample), each
// saying how many denials went unlogged since the rule's line before, so
// that a flood of denials never floods the log. Window.Logged and
// Window.Unlogged count the lines and the denials left out.
type DenialLog struct {
	Logger *slog.Logger
	// Every is the least time between two lines of a rule (default 1 s).
	Every time.Duration
	// Keys says how a rule's lines show its key: KeysHash (or ""), a
	// short hash; KeysRedact, not at all; KeysPlain, as it is. Nil: every
	// rule's hashed. It is called once per line written.
	Keys func(rule string) string
}

// How a denial's line shows its key (a rule's log_key).
const (
	KeysHash   = rules.LogKeyHash
	KeysRedact = rules.LogKeyRedact
	KeysPlain  = rules.LogKeyPlain
)

// WithDenialLog logs denials as l says.
func WithDenialLog(l DenialLog) Option {
	return func(t *Tracker) {
		if l.Every <= 0 {
			l.Every = time.Second
		}
		if l.Logger == nil {
			l.Logger = slog.Default()
		}
		t.log = &l
	}
}

// logState is one rule's record of its denial log.
type logState struct {
	next     atomic.Int64 // UnixNano: when the rule's next line may be written
	since    atomic.Int64 // denials unlogged since its last line
	logged   atomic.Int64 // lines written
	unlogged atomic.Int64 // denials left out, in all
}

// denied logs a denial on r's key, or counts it unlogged.
func (l *DenialLog) denied(now int64, r *ruleStats, mode rules.Mode, it *engine.Item) {
	next := r.log.next.Load()
	if now < next || !r.log.next.CompareAndSwap(next, now+int64(l.Every)) {
		r.log.since.Add(1)
		r.log.unlogged.Add(1)
		return
	}
	r.log.logged.Add(1)
	reason := engine.ReasonCostExceedsBurst // a cost the limit can never pass
	if it.Decided {
		reason = engine.ReasonOf(it.Limit)
	}
	how := KeysHash
	if l.Keys != nil {
		how = l.Keys(r.name)
	}
	attrs := []any{"rule", r.name, "mode", string(mode)}
	switch how {
	case KeysPlain:
		attrs = append(attrs, "key", it.Key)
	case KeysRedact:
	default:
		attrs = append(attrs, "key_hash", KeyHash(it.Key))
	}
	attrs = append(attrs, "reason", reason)
	if it.Decided {
		attrs = append(attrs, "retry_after", math.Ceil(it.Decision.RetryAfter.Seconds()))
	}
	attrs = append(attrs, "unlogged_before", r.log.since.Swap(0))
	l.Logger.Info("drip: denied", attrs...)
}

// KeyHash is how a denial's line shows a key it hashes (and the admin
// API beside each key, to find it): the first 16 hex digits of its
// SHA-256.
func KeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// LogCount is one rule's denial log: lines written, denials left out.
type LogCount struct {
	Rule             string
	Logged, Unlogged int64
}

// Logs returns the denial log's counts of every rule followed.
func (t *Tracker) Logs() []LogCount {
	var out []LogCount
	for name, r := range *t.rules.Load() {
		out = append(out, LogCount{name, r.log.logged.Load(), r.log.unlogged.Load()})
	}
	return out
}
