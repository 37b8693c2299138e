package simulate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/store"
)

// ReadTrace reads a trace in the JSON-lines format of drip replay (docs/api.md):
// "at" (seconds since the start), "op" (take, peek, refund or reset; take
// by default), "key", "cost" (default 1), "reserve" and "limit" (kept in
// Arrival.Limit; Run uses Options.Limit for lines without one). Multi-takes
// ("requests") are not simulated: they are an error, as is any bad line,
// reported with its line number.
func ReadTrace(r io.Reader) ([]Arrival, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	var evs []Arrival
	for n := 1; sc.Scan(); n++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		e, err := parseTraceLine(b)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		evs = append(evs, e)
		if len(evs) > MaxArrivals {
			return nil, fmt.Errorf("more than %d requests", MaxArrivals)
		}
	}
	return evs, sc.Err()
}

// parseTraceLine reads a line with drip replay's parser.
func parseTraceLine(b []byte) (Arrival, error) {
	r, err := replay.Decode(b, replay.LineFormat)
	if err != nil {
		return Arrival{}, err
	}
	if r.Requests != nil {
		return Arrival{}, errors.New("multi-takes (requests) are not simulated")
	}
	e := Arrival{At: r.At}
	switch r.Op {
	case "take":
		e.Op = Take
	case "peek":
		e.Op = Peek
	case "refund":
		e.Op = Refund
	case "reset":
		e.Op = Reset
	}
	if r.Key == "" {
		return Arrival{}, store.ErrMissingKey
	}
	e.Key, e.Reserve, e.Limit, e.Cost = r.Key, r.Reserve, r.Limit, 1
	if r.Cost != nil {
		e.Cost = *r.Cost
	}
	return e, nil
}

// LogOptions says how to read an access log.
type LogOptions struct {
	// KeyField is the whitespace-separated field (counted from 1) that
	// names the client, e.g. 1 for the address in nginx's and Apache's
	// common and combined formats. Zero means no key field.
	KeyField int
	// KeyPattern, when set, takes the key from the line instead: its
	// first group, or the whole match when it has none.
	KeyPattern *regexp.Regexp
	// Cost is the cost of each request (zero means 1).
	Cost float64
}

var (
	clfRE     = regexp.MustCompile(`\[(\d{2}/[A-Za-z]{3}/\d{4}:\d{2}:\d{2}:\d{2}(?:\.\d+)? [+-]\d{4})\]`)
	rfc3339RE = regexp.MustCompile(`\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:?\d{2})?`)
)

// LogStats reports what ReadLog read.
type LogStats struct {
	// Lines is the number of non-empty lines, Skipped those without a
	// timestamp, NoKey those without a key (they share the bucket "-").
	Lines, Skipped, NoKey int
	// Start is the earliest timestamp: virtual time 0.
	Start time.Time
}

// ReadLog reads an access log, one request per line, and returns its
// requests with times relative to the earliest one. A line's time is its
// first timestamp in the common log format ("[10/Oct/2000:13:55:36
// -0700]", as written by nginx and Apache) or RFC 3339
// ("2000-10-10T13:55:36.25Z"; a space for the T and a zone without a colon
// are accepted, a missing zone means UTC). Lines without a timestamp are
// skipped and counted. Without a key option, every request shares one
// bucket (DefaultKey); with one, each client has its own.
func ReadLog(r io.Reader, o LogOptions) ([]Arrival, LogStats, error) {
	var st LogStats
	type stamped struct {
		t   time.Time
		key string
	}
	var lines []stamped
	cost := o.Cost
	if cost == 0 {
		cost = 1
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		st.Lines++
		t, ok := logTime(line)
		if !ok {
			st.Skipped++
			continue
		}
		key := DefaultKey
		switch {
		case o.KeyPattern != nil:
			key = "-"
			if m := o.KeyPattern.FindStringSubmatch(line); m != nil {
				key = m[min(1, len(m)-1)]
			}
		case o.KeyField > 0:
			key = "-"
			if f := strings.Fields(line); len(f) >= o.KeyField {
				key = f[o.KeyField-1]
			}
		}
		if key == "-" || key == "" {
			key = "-"
			st.NoKey++
		}
		key = store.FitKey(key) // a huge field is a client of its own, not an error
		lines = append(lines, stamped{t, key})
		if len(lines) > MaxArrivals {
			return nil, st, fmt.Errorf("more than %d requests", MaxArrivals)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, st, err
	}
	if len(lines) == 0 {
		return nil, st, fmt.Errorf("no line of %d has a timestamp (common log format [10/Oct/2000:13:55:36 -0700] or RFC 3339)", st.Lines)
	}
	st.Start = lines[0].t
	for _, l := range lines {
		if l.t.Before(st.Start) {
			st.Start = l.t
		}
	}
	evs := make([]Arrival, len(lines))
	for i, l := range lines {
		evs[i] = Arrival{At: l.t.Sub(st.Start), Key: l.key, Cost: cost}
	}
	return evs, st, nil
}

// logTime finds a line's first timestamp.
func logTime(line string) (time.Time, bool) {
	clf := clfRE.FindStringSubmatchIndex(line)
	iso := rfc3339RE.FindStringIndex(line)
	if clf != nil && (iso == nil || clf[0] < iso[0]) {
		s := line[clf[2]:clf[3]]
		t, err := time.Parse("02/Jan/2006:15:04:05.999999999 -0700", s)
		return t, err == nil
	}
	if iso == nil {
		return time.Time{}, false
	}
	s := []byte(line[iso[0]:iso[1]])
	s[10] = 'T'
	str := strings.ToUpper(string(s))
	layout := "2006-01-02T15:04:05.999999999Z07:00"
	switch n := len(str); {
	case strings.HasSuffix(str, "Z"):
	case n >= 5 && (str[n-5] == '+' || str[n-5] == '-'):
		layout = "2006-01-02T15:04:05.999999999-0700"
	case n >= 6 && (str[n-6] == '+' || str[n-6] == '-'):
	default:
		str += "Z" // no zone: UTC
	}
	t, err := time.Parse(layout, str)
	return t, err == nil
}
