package httplimit

import (
	"context"
	"encoding/base64"
	"net/http/httptest"
	"testing"

	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// TestRepeatedValues: a header, query parameter or cookie sent twice is
// keyed on all its values, never on the first alone (two x-api-key
// headers had keyed on the first, which the upstream might not believe);
// a cost sent twice is not a number, so default_cost applies; and two
// Authorization headers give no claims.
func TestRepeatedValues(t *testing.T) {
	set, err := rules.Parse([]byte(`{"jwt": {"verify": false}, "rules": [
	  {"name": "h", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rps": 100, "cost_source": "header:x-weight", "default_cost": 1}},
	  {"name": "q", "limit_keys": ["query:k"], "algorithm_config": {"rps": 100}},
	  {"name": "c", "limit_keys": ["cookie:sid"], "algorithm_config": {"rps": 100}},
	  {"name": "j", "limit_keys": ["jwt:sub"], "algorithm_config": {"rps": 100}}
	]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	l := New(memstore.New(), set)
	defer l.Close()
	enc := base64.RawURLEncoding.EncodeToString
	token := enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc([]byte(`{"sub":"u1","exp":4102444800}`)) + ".c2ln"

	for _, tc := range []struct {
		name  string
		query string
		hdr   []string
		want  map[string]string // rule -> key; a rule absent did not apply
		cost  float64           // of rule h
	}{
		{"once each", "?k=a", []string{"X-Api-Key", "a", "X-Weight", "5", "Cookie", "sid=a", "Authorization", "Bearer " + token},
			map[string]string{"h": "h|a", "q": "q|a", "c": "c|a", "j": "j|u1"}, 5},
		{"twice each", "?k=a&k=b", []string{"X-Api-Key", "a", "X-Api-Key", "b", "X-Weight", "5", "X-Weight", "7",
			"Cookie", "sid=a; sid=b", "Authorization", "Bearer " + token, "Authorization", "Bearer " + token},
			map[string]string{"h": "h|a, b", "q": "q|a, b", "c": "c|a, b"}, 1},
		{"an empty line and a value", "?k=&k=b", []string{"X-Api-Key", "", "X-Api-Key", "b"},
			map[string]string{"h": "h|, b", "q": "q|, b"}, 1},
	} {
		r := httptest.NewRequest("GET", "/"+tc.query, nil)
		for i := 0; i+1 < len(tc.hdr); i += 2 {
			r.Header.Add(tc.hdr[i], tc.hdr[i+1])
		}
		res := l.Decide(context.Background(), r)
		got := map[string]string{}
		for _, a := range res.Applied {
			got[a.Rule.Name] = a.Key
			if a.Rule.Name == "h" && a.Cost != tc.cost {
				t.Errorf("%s: cost %v, want %v", tc.name, a.Cost, tc.cost)
			}
		}
		if len(got) != len(tc.want) {
			t.Errorf("%s: keys %q, want %q", tc.name, got, tc.want)
		}
		for rule, key := range tc.want {
			if got[rule] != key {
				t.Errorf("%s: rule %s keyed on %q, want %q", tc.name, rule, got[rule], key)
			}
		}
	}
}
