package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/driplimit/drip/internal/nearest"
	"github.com/driplimit/drip/server/envoy"
)

// envoyDRIPVariables are the DRIP_ names drip serve reads besides its
// flags': those envoy.OptionsFromEnv asks for (DRIP_ENVOY_ALGORITHM,
// DRIP_ENVOY_LEASED), found by asking it.
func envoyDRIPVariables() []string {
	var names []string
	_, _ = envoy.OptionsFromEnv(func(k string) string { // nothing set: no error, every name asked
		if strings.HasPrefix(k, "DRIP_") {
			names = append(names, k)
		}
		return ""
	})
	return names
}

// misspeltDRIP refuses the first DRIP_ variable in environ (os.Environ's
// form), in sort order, that drip serve does not read but that is within
// two edits of a name it does: DRIP_STOER would otherwise start drip on
// the memory store. Other DRIP_ names pass, as a rules file may read its
// secrets from any variable (DRIP_KEY_SECRET, say).
func misspeltDRIP(fs *flag.FlagSet, environ []string) error {
	known := envoyDRIPVariables()
	fs.VisitAll(func(f *flag.Flag) {
		known = append(known, "DRIP_"+strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_")))
	})
	var set []string
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "DRIP_") && v != "" && !slices.Contains(known, k) {
			set = append(set, k)
		}
	}
	slices.Sort(set)
	for _, k := range set {
		if near, d := nearest.Name(k, known); d >= 0 && d <= 2 {
			return fmt.Errorf("%s is set, but drip serve has no such variable: did you mean %s? A misspelt setting would start drip without it; unset %s or correct its name (docs/serve.md)", k, near, k)
		}
	}
	return nil
}
