package pace

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/driplimit/drip/internal/sfv"
)

// report is what one response said about one of the server's limits (a
// policy: one per rule that applied).
type report struct {
	name      string        // the policy's name; for the single-value headers, X-RateLimit-Resource or ""
	remaining int64         // requests left in the current window
	reset     time.Duration // until the quota comes back; 0 with hasReset false: unknown
	hasReset  bool
	limit     int64 // the quota restored at reset; 0: unknown
	// concurrent: the quota is of requests in flight at once
	// (qu="concurrent-requests"): limit of them, never a window to wait out.
	concurrent bool
}

// maxPolicies bounds the policies read from one response and kept per key.
const maxPolicies = 8

// maxDelay bounds every delay read from a header, so that no arithmetic
// overflows: a server that asks for more than a year is answered as if it
// asked for a year (MaxWait refuses far less).
const maxDelay = 366 * 24 * time.Hour

// maxCount bounds every count read from a header.
const maxCount = 1 << 40

// Epoch thresholds for Reset values: see the package documentation.
const (
	epochSeconds = 100_000_000     // 1973 as a Unix time, over three years as a delay
	epochMillis  = 100_000_000_000 // year 5138 in seconds: a Unix time in milliseconds
)

// parseReport reads the rate limit headers of h, in order of preference:
// RateLimit (with RateLimit-Policy for the quotas), the RateLimit-Limit,
// -Remaining and -Reset triple, and the X-RateLimit- triple. It returns
// nothing when none gives a remaining count. server is serverNow's answer.
func parseReport(h http.Header, server time.Time) []report {
	if rs := parseStructured(h); len(rs) > 0 {
		return rs
	}
	for _, prefix := range []string{"Ratelimit-", "X-Ratelimit-"} {
		rem, ok := count(h.Get(prefix + "Remaining"))
		if !ok {
			continue
		}
		r := report{name: h.Get(prefix + "Resource"), remaining: rem} // GitHub names its limits: core, search, ...
		r.limit, _ = count(h.Get(prefix + "Limit"))
		r.reset, r.hasReset = resetValue(h.Get(prefix+"Reset"), server)
		return []report{r}
	}
	return nil
}

// parseStructured reads RateLimit: "name";r=7;t=2 (a list: one item per
// policy) and RateLimit-Policy: "name";q=20;w=2 (the quota of each, and
// its unit: qu="concurrent-requests" makes it a bound on requests in
// flight), the first maxPolicies policies with an r.
func parseStructured(h http.Header) []report {
	items, err := sfv.ParseList(strings.Join(h.Values("Ratelimit"), ", "))
	if err != nil {
		return nil
	}
	var rs []report
	for _, it := range items {
		r, ok := param(it, "r")
		if !ok || len(rs) == maxPolicies {
			continue
		}
		t, hasT := param(it, "t")
		rs = append(rs, report{name: name(it), remaining: r, reset: seconds(float64(t)), hasReset: hasT})
	}
	policies, err := sfv.ParseList(strings.Join(h.Values("Ratelimit-Policy"), ", "))
	if err != nil {
		return rs
	}
	for _, it := range policies {
		q, ok := param(it, "q")
		if !ok || q <= 0 {
			continue
		}
		for i := range rs {
			if rs[i].name == name(it) {
				rs[i].limit = q
				rs[i].concurrent = unit(it) == sfv.UnitConcurrentRequests
			}
		}
	}
	return rs
}

// unit is a policy's quota unit (its "qu" string), or "" when it has none.
func unit(it sfv.Item) string {
	for _, p := range it.Params {
		if p.Key == "qu" {
			u, _ := p.Value.(string)
			return u
		}
	}
	return ""
}

// name is a policy's name: its sf-string or sf-token, as written.
func name(it sfv.Item) string {
	switch v := it.Value.(type) {
	case string:
		return v
	case sfv.Token:
		return string(v)
	}
	return fmt.Sprint(it.Value)
}

// param returns an item's non-negative integer parameter (a decimal is
// rounded down).
func param(it sfv.Item, key string) (int64, bool) {
	for _, p := range it.Params {
		if p.Key != key {
			continue
		}
		switch v := p.Value.(type) {
		case int64:
			if v >= 0 {
				return min(v, maxCount), true
			}
		case float64:
			if v >= 0 {
				return int64(min(v, maxCount)), true
			}
		}
		return 0, false
	}
	return 0, false
}

// count reads a non-negative count: the leading number of the value (older
// drafts allow "20, 20;w=1" in RateLimit-Limit), rounded down.
func count(v string) (int64, bool) {
	x, ok := number(v)
	if !ok {
		return 0, false
	}
	return int64(min(x, maxCount)), true
}

// number reads the leading non-negative finite number of a header value.
func number(v string) (float64, bool) {
	v = strings.TrimSpace(v)
	if i := strings.IndexAny(v, ",; "); i >= 0 {
		v = v[:i]
	}
	if v == "" {
		return 0, false
	}
	x, err := strconv.ParseFloat(v, 64)
	if err != nil || x < 0 || math.IsInf(x, 0) || math.IsNaN(x) {
		return 0, false
	}
	return x, true
}

// resetValue reads a Reset header: a delay in seconds, or a Unix time in
// seconds (at least epochSeconds) or milliseconds (at least epochMillis),
// measured from the response's Date when it has one (so that the two
// clocks need not agree), else from the client's clock.
func resetValue(v string, server time.Time) (time.Duration, bool) {
	x, ok := number(v)
	if !ok {
		return 0, false
	}
	if x < epochSeconds {
		return seconds(x), true
	}
	if x >= epochMillis {
		x /= 1000
	}
	sec, frac := math.Modf(min(x, 1e12)) // 1e12: beyond any reset, within time's range
	return until(time.Unix(int64(sec), int64(frac*1e9)), server), true
}

// retryAfter reads Retry-After: seconds, or an HTTP-date measured from
// server (serverNow's answer).
func retryAfter(h http.Header, server time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if x, err := strconv.ParseFloat(v, 64); err == nil {
		if x < 0 || math.IsNaN(x) {
			return 0, false
		}
		return seconds(x), true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return until(at, server), true
}

// until is the delay from the server's now to at.
func until(at, server time.Time) time.Duration {
	return min(max(at.Sub(server), 0), maxDelay)
}

// serverNow is the server's time when it answered: the response's Date
// when it has a valid one (one-second resolution, rounded down, so delays
// measured from it err long), else the client's now.
func serverNow(h http.Header, now time.Time) time.Time {
	if d, err := http.ParseTime(h.Get("Date")); err == nil {
		return d
	}
	return now
}

// seconds converts a count of seconds, bounded by maxDelay.
func seconds(x float64) time.Duration {
	if x >= maxDelay.Seconds() {
		return maxDelay
	}
	return time.Duration(x * float64(time.Second))
}
