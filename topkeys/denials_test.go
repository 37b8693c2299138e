package topkeys

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
)

// TestDenialLog: a flood of denials writes one line per rule per Every,
// the next line says how many went unlogged, and each rule's log_key
// says how its key shows.
func TestDenialLog(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{t: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	keys := map[string]string{"hashed": "", "redacted": rules.LogKeyRedact, "plain": rules.LogKeyPlain}
	tr := New(WithClock(c.now), WithDenialLog(DenialLog{
		Logger: slog.New(slog.NewJSONHandler(&buf, nil)),
		Keys:   func(rule string) string { return keys[rule] },
	}))
	deny := func(rule string) {
		it := &engine.Item{Key: rule + "|secret-key", Limit: drip.Limit{Algorithm: drip.FixedWindow}, Verdict: engine.Verdict{Decided: true,
			Decision: drip.Decision{Tokens: 0, Burst: 5, RetryAfter: 1500 * time.Millisecond}}}
		tr.Key(rule, rules.Enforce, engine.Denied, it)
	}
	for range 1000 {
		deny("hashed")
	}
	deny("plain")
	deny("redacted")
	c.t = c.t.Add(999 * time.Millisecond)
	deny("hashed") // within the second: unlogged
	c.t = c.t.Add(time.Millisecond)
	deny("hashed")

	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		delete(m, "time")
		lines = append(lines, m)
	}
	want := []map[string]any{
		{"level": "INFO", "msg": "drip: denied", "rule": "hashed", "mode": "enforce", "key_hash": KeyHash("hashed|secret-key"), "reason": "fixed_window_exceeded", "retry_after": 2.0, "unlogged_before": 0.0},
		{"level": "INFO", "msg": "drip: denied", "rule": "plain", "mode": "enforce", "key": "plain|secret-key", "reason": "fixed_window_exceeded", "retry_after": 2.0, "unlogged_before": 0.0},
		{"level": "INFO", "msg": "drip: denied", "rule": "redacted", "mode": "enforce", "reason": "fixed_window_exceeded", "retry_after": 2.0, "unlogged_before": 0.0},
		{"level": "INFO", "msg": "drip: denied", "rule": "hashed", "mode": "enforce", "key_hash": KeyHash("hashed|secret-key"), "reason": "fixed_window_exceeded", "retry_after": 2.0, "unlogged_before": 1000.0},
	}
	g, _ := json.Marshal(lines)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("lines\n%s\nwant\n%s", g, w)
	}
	if strings.Count(buf.String(), "secret-key") != 1 {
		t.Error("a hashed or redacted key's line shows the key")
	}
	v, _ := tr.Rule("hashed", Minute, 1)
	if v.Logged != 2 || v.Unlogged != 1000 || v.Denials != 1002 {
		t.Errorf("logged %d, unlogged %d of %d denials; want 2, 1000 of 1002", v.Logged, v.Unlogged, v.Denials)
	}
	if KeyHash("a") != "ca978112ca1bbdca" { // SHA-256 of "a", its first 8 bytes
		t.Errorf("KeyHash(a) = %s", KeyHash("a"))
	}
}
