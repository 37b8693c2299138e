package frontdoor

import (
	"testing"

	"github.com/driplimit/drip/rules"
)

// TestAPIKey: api_key is the bearer token of Authorization (as OpenAI's
// and Anthropic's SDKs send it), else x-api-key (as Anthropic's API and
// curl examples do); a header sent twice, another scheme or an empty
// token is no key.
func TestAPIKey(t *testing.T) {
	for _, c := range []struct {
		h    map[string][]string
		want string
		ok   bool
	}{
		{map[string][]string{"Authorization": {"Bearer sk-1"}}, "sk-1", true},
		{map[string][]string{"Authorization": {"bearer  sk-1 "}}, "sk-1", true},
		{map[string][]string{"X-Api-Key": {"sk-ant"}}, "sk-ant", true},
		{map[string][]string{"Authorization": {"Bearer sk-1"}, "X-Api-Key": {"sk-ant"}}, "sk-1", true},
		{map[string][]string{"Authorization": {"Basic dTpw"}, "X-Api-Key": {"sk-ant"}}, "sk-ant", true},
		{map[string][]string{"Authorization": {"Bearer a", "Bearer b"}}, "", false},
		{map[string][]string{"X-Api-Key": {"a", "b"}}, "", false},
		{map[string][]string{"Authorization": {"Bearer "}}, "", false},
		{map[string][]string{}, "", false},
	} {
		v := Base{Header: c.h}
		got, ok := v.Value(rules.Source{Kind: rules.KindAPIKey})
		if got != c.want || ok != c.ok {
			t.Errorf("%v: %q %v, want %q %v", c.h, got, ok, c.want, c.ok)
		}
	}
}
