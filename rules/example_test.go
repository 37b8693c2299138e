package rules_test

import (
	"fmt"

	"github.com/driplimit/drip/rules"
)

func ExampleParse() {
	set, err := rules.Parse([]byte(`
rules:
  - name: free
    limit_keys: [header:x-api-key]
    algorithm_config: {rps: 10, burst: 20}
`), "rules.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	free, _ := set.Rule("free")
	fmt.Println(free.Limit, free.LimitKeys[0])
	fmt.Println(free.Key([]string{"k|1"}))
	// Output:
	// 10/1s burst 20 header:x-api-key
	// free|k\|1
}

// Every problem is reported at once, each with its line and path.
func ExampleError() {
	_, err := rules.Parse([]byte(`{"rules": [
		{"name": "free", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rps": 10, "burst": 0}},
		{"name": "free", "limit_keys": ["user"],
		 "algorithm_config": {"rps": 10, "brust": 20}}]}`), "rules.json")
	fmt.Println(err)
	// Output:
	// rules.json:2: rules[0].algorithm_config.burst: must be > 0
	// rules.json:3: rules[1].limit_keys[0]: "user" is not a key source (ip:address, header:<name>, query:<name>, jwt:<claim>, path, method, cookie:<name>, global)
	// rules.json:4: rules[1].algorithm_config.brust: unknown field (did you mean "burst"?)
	// rules.json:3: rules[1].name: "free" is already the name of rules[0]
}
