package rules

import (
	"os"
	"strings"
	"testing"
)

func TestSettleFields(t *testing.T) {
	s, err := Parse([]byte(`{"rules": [
	{"name": "llm", "limit_keys": ["header:x-tenant"], "cost_from_response": "trailer:x-usage-tokens",
	 "algorithm_config": {"rate": 100000, "period": "1m", "cost_source": "header:x-max-tokens", "default_cost": 1000}},
	{"name": "logins", "limit_keys": ["header:x-user"], "count_status": ["4xx", 503],
	 "algorithm_config": {"rate": 5, "period": "1h"}},
	{"name": "plain", "limit_keys": ["global"], "algorithm_config": {"rps": 5}}]}`), "r.json")
	if err != nil {
		t.Fatal(err)
	}
	llm, logins, plain := &s.Rules[0], &s.Rules[1], &s.Rules[2]
	if !llm.Settles() || !logins.Settles() || plain.Settles() {
		t.Fatalf("Settles: %v %v %v", llm.Settles(), logins.Settles(), plain.Settles())
	}
	if *llm.CostFrom != (ResponseSource{Trailer: true, Name: "X-Usage-Tokens"}) || llm.CostFrom.String() != "trailer:x-usage-tokens" {
		t.Errorf("cost_from_response %+v", llm.CostFrom)
	}
	for code, want := range map[int]bool{399: false, 400: true, 401: true, 499: true, 500: false, 503: true, 200: false} {
		if logins.CountStatus.Has(code) != want {
			t.Errorf("count_status has %d: %v", code, !want)
		}
	}
}

// TestSettleDocs: the rules files docs/rules.md shows for rules that know
// the response load.
func TestSettleDocs(t *testing.T) {
	doc, err := os.ReadFile("../docs/rules.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "## Rules that know the response\n")
	if !ok {
		t.Fatal("docs/rules.md has no section on rules that know the response")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	n := 0
	for {
		_, after, ok := strings.Cut(sec, "```yaml\n")
		if !ok {
			break
		}
		var block string
		block, sec, _ = strings.Cut(after, "```")
		set, err := Parse([]byte(block), "shown.yaml")
		if err != nil {
			t.Errorf("%v\n%s", err, block)
			continue
		}
		if !set.Rules[0].Settles() {
			t.Errorf("a rule that does not settle:\n%s", block)
		}
		n++
	}
	if n != 2 {
		t.Errorf("%d blocks, want 2", n)
	}
}
