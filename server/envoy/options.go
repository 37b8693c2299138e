package envoy

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"

	"golang.org/x/net/http/httpguts"

	"github.com/driplimit/drip"
)

// Options are the settings of loading a configuration, and of answering
// with it, that envoyproxy/ratelimit takes from its environment; the zero
// value is its defaults, except that Load skips dotfiles (LoadWith does
// not) and that responses carry drip's RateLimit headers (HeadersDrip),
// where envoyproxy/ratelimit sends none by default.
type Options struct {
	// MergeDomains lets several files configure one domain: their
	// descriptors are added together (MERGE_DOMAIN_CONFIG).
	MergeDomains bool
	// Shadow puts every configured limit in shadow mode: decided, counted,
	// never denying (SHADOW_MODE), those a request sets itself
	// (descriptor "limit") included, as envoyproxy/ratelimit lets every
	// request through under it; the status of a limit over still says
	// OVER_LIMIT.
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
	// Leased marks every rate_limit without its own "leased" as leased
	// (drip.Limit.Leased; DRIP_ENVOY_LEASED=true): decided from blocks of
	// leased tokens when drip serve's store holds them. drip's own
	// setting; limits a request sets itself are never leased.
	Leased bool
	// Quota puts every limit in quota mode (QUOTA_MODE), those a request
	// sets itself included: a request is over the limit when a limit
	// without quota mode is, or when every quota limit of the request is
	// (see Limit.Quota).
	Quota bool
	// DynamicMetadata adds envoyproxy/ratelimit's dynamic metadata to each
	// response (RESPONSE_DYNAMIC_METADATA): the request's domain,
	// descriptors and hits_addend, and the metadata of the limits of the
	// descriptors that were not over their limit.
	DynamicMetadata bool
	// Headers are the rate limit headers of the response.
	Headers Headers
}

// Headers chooses the rate limit headers the service asks Envoy to add to
// the response (response_headers_to_add).
type Headers struct {
	// Mode is HeadersDrip (""), HeadersEnvoy or HeadersNone.
	Mode HeaderMode
	// Limit, Remaining and Reset name envoyproxy/ratelimit's three headers
	// under HeadersEnvoy (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER,
	// LIMIT_RESET_HEADER); "" is its default name: RateLimit-Limit,
	// RateLimit-Remaining, RateLimit-Reset.
	Limit, Remaining, Reset string
}

// HeaderMode is which rate limit headers a response carries.
type HeaderMode string

const (
	// HeadersDrip: drip's RateLimit-Policy, RateLimit, RateLimit-Limit,
	// RateLimit-Remaining, RateLimit-Reset, and Retry-After on a denial,
	// as its HTTP middleware writes them (LIMIT_RESPONSE_HEADERS_ENABLED
	// unset).
	HeadersDrip HeaderMode = ""
	// HeadersEnvoy: envoyproxy/ratelimit's three headers
	// (LIMIT_RESPONSE_HEADERS_ENABLED=true), of one descriptor: the last
	// one over its limit that is not in quota mode, else the first with
	// the fewest requests remaining; the limit is its requests_per_unit,
	// the remaining its limit_remaining, the reset its
	// duration_until_reset in whole seconds (rounded up).
	HeadersEnvoy HeaderMode = "envoy"
	// HeadersNone: no header (LIMIT_RESPONSE_HEADERS_ENABLED=false, as
	// envoyproxy/ratelimit answers by default).
	HeadersNone HeaderMode = "none"
)

// names are the three header names of HeadersEnvoy, defaults filled in.
func (h Headers) names() (limit, remaining, reset string) {
	limit, remaining, reset = h.Limit, h.Remaining, h.Reset
	if limit == "" {
		limit = "RateLimit-Limit"
	}
	if remaining == "" {
		remaining = "RateLimit-Remaining"
	}
	if reset == "" {
		reset = "RateLimit-Reset"
	}
	return limit, remaining, reset
}

// OptionsFromEnv reads Options from envoyproxy/ratelimit's environment
// variables, through getenv (os.Getenv): MERGE_DOMAIN_CONFIG,
// SHADOW_MODE, QUOTA_MODE, RUNTIME_IGNOREDOTFILES,
// RESPONSE_DYNAMIC_METADATA, each true or false (as strconv.ParseBool
// reads them; unset or empty is false); LIMIT_RESPONSE_HEADERS_ENABLED
// (true: HeadersEnvoy, false: HeadersNone, unset or empty: HeadersDrip)
// and LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER
// (header names); and drip's DRIP_ENVOY_ALGORITHM and DRIP_ENVOY_LEASED
// (true or false, as the others).
func OptionsFromEnv(getenv func(string) string) (Options, error) {
	var o Options
	var headers bool
	for _, v := range []struct {
		name string
		to   *bool
	}{
		{"MERGE_DOMAIN_CONFIG", &o.MergeDomains},
		{"SHADOW_MODE", &o.Shadow},
		{"QUOTA_MODE", &o.Quota},
		{"RUNTIME_IGNOREDOTFILES", &o.IgnoreDotfiles},
		{"RESPONSE_DYNAMIC_METADATA", &o.DynamicMetadata},
		{"LIMIT_RESPONSE_HEADERS_ENABLED", &headers},
		{"DRIP_ENVOY_LEASED", &o.Leased},
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
	switch {
	case headers:
		o.Headers.Mode = HeadersEnvoy
	case getenv("LIMIT_RESPONSE_HEADERS_ENABLED") != "":
		o.Headers.Mode = HeadersNone
	}
	for _, v := range []struct {
		name string
		to   *string
	}{
		{"LIMIT_LIMIT_HEADER", &o.Headers.Limit},
		{"LIMIT_REMAINING_HEADER", &o.Headers.Remaining},
		{"LIMIT_RESET_HEADER", &o.Headers.Reset},
	} {
		s := getenv(v.name)
		if s != "" && !httpguts.ValidHeaderFieldName(s) {
			return Options{}, fmt.Errorf("%s=%q: not a header name", v.name, s)
		}
		*v.to = s
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

// GRPCListen is the address envoyproxy/ratelimit serves gRPC on from its
// environment: GRPC_HOST (default 0.0.0.0) and GRPC_PORT (default 8081).
// It is "" when neither is set, so that a deployment without them keeps
// drip's own default (no gRPC listener without --grpc-listen).
func GRPCListen(getenv func(string) string) (string, error) {
	host, port := getenv("GRPC_HOST"), getenv("GRPC_PORT")
	if host == "" && port == "" {
		return "", nil
	}
	if host == "" {
		host = "0.0.0.0"
	}
	if port == "" {
		port = "8081"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", fmt.Errorf("GRPC_PORT=%q: want a port number", port)
	}
	return net.JoinHostPort(host, port), nil
}
