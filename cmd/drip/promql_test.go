package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// promqlRefs reads a PromQL expression far enough to say which metric
// names it selects and which label names it uses, in matchers and in
// by, without, on, ignoring, group_left and group_right clauses. Strings,
// numbers, durations, ranges and Grafana variables ($x, ${x}) are skipped;
// a word followed by "(" must be a PromQL function or aggregation, so that
// a typo in one is not taken for a metric.
func promqlRefs(expr string) (metrics, labels []string, err error) {
	add := func(list *[]string, s string) {
		if !slices.Contains(*list, s) {
			*list = append(*list, s)
		}
	}
	i, n := 0, len(expr)
	skipSpace := func() {
		for i < n && strings.ContainsRune(" \t\r\n", rune(expr[i])) {
			i++
		}
	}
	word := func() string {
		j := i
		for i < n && isWordByte(expr[i], i > j) {
			i++
		}
		return expr[j:i]
	}
	// skipString skips the string literal at i.
	skipString := func() error {
		q := expr[i]
		for i++; i < n; i++ {
			switch {
			case expr[i] == '\\' && q != '`':
				i++
			case expr[i] == q:
				i++
				return nil
			}
		}
		return fmt.Errorf("unterminated string in %q", expr)
	}
	// labelList reads "(a, b, ...)" after a grouping keyword.
	labelList := func() error {
		skipSpace()
		if i >= n || expr[i] != '(' {
			return nil // group_left without labels
		}
		i++
		for {
			skipSpace()
			if i < n && expr[i] == ')' {
				i++
				return nil
			}
			w := word()
			if w == "" {
				return fmt.Errorf("want a label name at offset %d of %q", i, expr)
			}
			add(&labels, w)
			skipSpace()
			if i < n && expr[i] == ',' {
				i++
			}
		}
	}
	// matchers reads "{name op "value", ...}".
	matchers := func() error {
		i++ // {
		for {
			skipSpace()
			if i < n && expr[i] == '}' {
				i++
				return nil
			}
			name := word()
			if name == "" {
				return fmt.Errorf("want a label name at offset %d of %q", i, expr)
			}
			skipSpace()
			j := i
			for i < n && strings.ContainsRune("=!~", rune(expr[i])) {
				i++
			}
			if op := expr[j:i]; op != "=" && op != "!=" && op != "=~" && op != "!~" {
				return fmt.Errorf("bad matcher operator %q in %q", op, expr)
			}
			skipSpace()
			if i >= n || !strings.ContainsRune("\"'`", rune(expr[i])) {
				return fmt.Errorf("want a string after label %s in %q", name, expr)
			}
			v := i
			if err := skipString(); err != nil {
				return err
			}
			if name == "__name__" {
				add(&metrics, strings.Trim(expr[v:i], "\"'`"))
			} else {
				add(&labels, name)
			}
			skipSpace()
			if i < n && expr[i] == ',' {
				i++
			}
		}
	}
	for i < n {
		c := expr[i]
		switch {
		case strings.ContainsRune(" \t\r\n", rune(c)):
			i++
		case c == '#':
			for i < n && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			if err := skipString(); err != nil {
				return nil, nil, err
			}
		case c == '[': // a range or subquery: durations and variables
			for i < n && expr[i] != ']' {
				i++
			}
			i++
		case c == '{':
			if err := matchers(); err != nil {
				return nil, nil, err
			}
		case c == '$': // a Grafana variable
			i++
			if i < n && expr[i] == '{' {
				for i < n && expr[i] != '}' {
					i++
				}
				i++
			} else {
				word()
			}
		case c >= '0' && c <= '9' || c == '.' && i+1 < n && expr[i+1] >= '0' && expr[i+1] <= '9':
			for i < n && (isWordByte(expr[i], true) || expr[i] == '.' ||
				(expr[i] == '+' || expr[i] == '-') && (expr[i-1] == 'e' || expr[i-1] == 'E')) {
				i++
			}
		case isWordByte(c, false):
			w := word()
			switch {
			case groupingKeywords[w]:
				if err := labelList(); err != nil {
					return nil, nil, err
				}
				continue
			case otherKeywords[strings.ToLower(w)]:
				continue
			}
			skipSpace()
			if aggregations[w] {
				continue
			}
			if i < n && expr[i] == '(' {
				if !functions[w] {
					return nil, nil, fmt.Errorf("%s(...) is not a PromQL function, in %q", w, expr)
				}
				continue
			}
			add(&metrics, w)
		default:
			i++ // an operator, a parenthesis or a comma
		}
	}
	return metrics, labels, nil
}

func isWordByte(c byte, inside bool) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || inside && c >= '0' && c <= '9'
}

var (
	groupingKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	otherKeywords    = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true, "atan2": true, "start": true, "end": true}
	aggregations     = map[string]bool{"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
		"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true}
	functions = map[string]bool{}
)

func init() {
	for _, f := range strings.Fields(`abs absent absent_over_time avg_over_time ceil changes clamp clamp_max clamp_min
		count_over_time day_of_month day_of_week day_of_year days_in_month delta deriv exp floor
		histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar histogram_sum
		holt_winters double_exponential_smoothing hour idelta increase irate label_join label_replace last_over_time ln log10 log2
		max_over_time min_over_time minute month predict_linear present_over_time quantile_over_time rate resets round
		scalar sgn sort sort_desc sort_by_label sort_by_label_desc sqrt stddev_over_time stdvar_over_time sum_over_time
		time timestamp vector year`) {
		functions[f] = true
	}
	for a := range aggregations {
		functions[a] = true
	}
}

// TestPromqlRefs: the reader finds metric and label names and nothing
// else, and refuses what it cannot read.
func TestPromqlRefs(t *testing.T) {
	cases := []struct {
		expr            string
		metrics, labels []string
	}{
		{`histogram_quantile(0.99, sum by (le, op) (rate(a_seconds_bucket{instance=~"$instance", op!="x,}"}[$__rate_interval])))`,
			[]string{"a_seconds_bucket"}, []string{"le", "op", "instance"}},
		{"sum without(pod) (rate(x_total[5m] offset 1h)) / on (job) group_left(env) y{__name__=\"z\"} > bool 1e-3",
			[]string{"x_total", "y", "z"}, []string{"pod", "job", "env"}},
		{`time() - min(t{a='b'}) unless ${v} and count(w) > .5`, []string{"t", "w"}, []string{"a"}},
		{"sum(rate(c:recorded:rate5m[1m:10s])) # a comment names_no_metric\n", []string{"c:recorded:rate5m"}, nil},
	}
	for _, c := range cases {
		m, l, err := promqlRefs(c.expr)
		if err != nil || !slices.Equal(m, c.metrics) || !slices.Equal(l, c.labels) {
			t.Errorf("promqlRefs(%q) = %q, %q, %v; want %q, %q", c.expr, m, l, err, c.metrics, c.labels)
		}
	}
	for _, bad := range []string{`rat(x[5m])`, `x{a="b`, `x{a b}`, `x{a=b}`} {
		if _, _, err := promqlRefs(bad); err == nil {
			t.Errorf("promqlRefs(%q) accepted it", bad)
		}
	}
}
