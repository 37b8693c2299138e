package strictjson

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzFastCheck: where the fast check is sure, it reports what the walk
// over tokens reports (the same error, or none), on the documents Check
// hands them (valid UTF-8, escapes that are characters).
func FuzzFastCheck(f *testing.F) {
	for _, s := range []string{
		`{"key": "user:1", "limit": {"rate": 10, "burst": 20}, "cost": 1}`,
		`{"rule": "free", "values": {"header:x-api-key": "k", "Header:X": "v"}}`,
		`{"rule": "free", "values": ["a", "b"], "values": 1}`,
		`{"requests": [{"key": "a", "limit": {"rate": 1e3, "burst": -0.5E+2}}, {"key": "b\u00e9", "cost": null, "reserve": true}]}`,
		`{"KEY": 1}`, `{"a": 1, "a": 2}`, `{"a":1.2.3,"a":2}`, `{"a": [1,]}`, `{"a": "x\"y"} `, `{} x`,
		`{"v":[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}`, `{"k\u0065y": 1}`, `{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"a":0}`,
	} {
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, b []byte, withFree bool) {
		free := ""
		if withFree {
			free = "values"
		}
		if !utf8.Valid(b) || checkEscapes(b) != nil {
			return // Check refuses it before either
		}
		fast, sure := fastCheck(b, free)
		if !sure {
			return
		}
		slow := slowCheck(b, free)
		if (fast == nil) != (slow == nil) || fast != nil && fast.Error() != slow.Error() {
			t.Fatalf("%q: fast %v, slow %v", b, fast, slow)
		}
	})
}

// TestFastCheckSure: the decision API's usual bodies are the fast check's.
func TestFastCheckSure(t *testing.T) {
	for _, s := range []string{
		`{"key": "user:1", "limit": {"rate": 10, "burst": 20}, "cost": 1}`,
		`{"rule": "free", "values": ["k-123"]}`,
		`{"requests": [{"key": "a", "limit": {"rate": 1, "period": "1m"}}, {"rule": "r", "values": {"Header:X": "v"}}]}` + "\n",
	} {
		if _, sure := fastCheck([]byte(s), "values"); !sure {
			t.Errorf("%s: not for the fast check", s)
		}
	}
	if _, sure := fastCheck([]byte(`{"a":1,`+strings.Repeat(" ", 3)), "values"); sure {
		t.Error("a document cut short is for the walk to decide")
	}
}
