package envoy

import (
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/driplimit/drip"
)

// Options are the settings of loading a configuration that
// envoyproxy/ratelimit takes from its environment; the zero value is its
// defaults, except that Load skips dotfiles (LoadWith does not).
type Options struct {
	// MergeDomains lets several files configure one domain: their
	// descriptors are added together (MERGE_DOMAIN_CONFIG).
	MergeDomains bool
	// Shadow puts every configured limit in shadow mode: decided, counted,
	// never denying (SHADOW_MODE). A limit a request sets itself
	// (descriptor "limit") is still enforced.
	Shadow bool
	// IgnoreDotfiles skips the files of a directory whose names begin
	// with '.' (RUNTIME_IGNOREDOTFILES); otherwise those that are
	// envoyproxy/ratelimit files are loaded.
	IgnoreDotfiles bool
	// Algorithm is the algorithm of every rate_limit without its own
	// "algorithm": "" or drip.TokenBucket (continuous refill, the
	// default), or drip.FixedWindow (envoyproxy/ratelimit's windows:
	// requests_per_unit per unit, counted on the unit's grid from the Unix
	// epoch). drip's own setting (DRIP_ENVOY_ALGORITHM): envoyproxy/ratelimit
	// has no other algorithm.
	Algorithm drip.Algorithm
}

// OptionsFromEnv reads Options from envoyproxy/ratelimit's environment
// variables, through getenv (os.Getenv): MERGE_DOMAIN_CONFIG,
// SHADOW_MODE, RUNTIME_IGNOREDOTFILES, each true or false (as
// strconv.ParseBool reads them; unset or empty is false), and drip's
// DRIP_ENVOY_ALGORITHM.
func OptionsFromEnv(getenv func(string) string) (Options, error) {
	var o Options
	for _, v := range []struct {
		name string
		to   *bool
	}{
		{"MERGE_DOMAIN_CONFIG", &o.MergeDomains},
		{"SHADOW_MODE", &o.Shadow},
		{"RUNTIME_IGNOREDOTFILES", &o.IgnoreDotfiles},
	} {
		s := getenv(v.name)
		if s == "" {
			continue
		}
		b, err := strconv.ParseBool(s)
		if err != nil {
			return Options{}, fmt.Errorf("%s=%q: want true or false", v.name, s)
		}
		*v.to = b
	}
	switch a := drip.Algorithm(getenv("DRIP_ENVOY_ALGORITHM")); a {
	case "", drip.TokenBucket, drip.FixedWindow:
		o.Algorithm = a
	default:
		return Options{}, fmt.Errorf("DRIP_ENVOY_ALGORITHM=%q: want token_bucket or fixed_window", string(a))
	}
	return o, nil
}

// RuntimeDir is where envoyproxy/ratelimit reads its configuration files
// from its environment: RUNTIME_ROOT (default /srv/runtime_data/current),
// then RUNTIME_SUBDIRECTORY, then RUNTIME_APPDIRECTORY (default
// "config"), joined. It is "" when neither RUNTIME_ROOT nor
// RUNTIME_SUBDIRECTORY is set, so that a deployment without them keeps
// drip's own defaults.
func RuntimeDir(getenv func(string) string) string {
	root, sub, app := getenv("RUNTIME_ROOT"), getenv("RUNTIME_SUBDIRECTORY"), getenv("RUNTIME_APPDIRECTORY")
	if root == "" && sub == "" {
		return ""
	}
	if root == "" {
		root = "/srv/runtime_data/current"
	}
	if app == "" {
		app = "config"
	}
	return filepath.Join(root, sub, app)
}
