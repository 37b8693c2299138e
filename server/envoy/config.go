package envoy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
)

// Config is a set of domains loaded from envoyproxy/ratelimit configuration
// files. It is immutable once built: a reload builds a new one. The zero
// value (and nil) has no domain, so that every request is OK.
type Config struct {
	domains map[string]*node
	files   []string
	// opts are the options it was loaded with; the service answers as
	// they say (quota mode, dynamic metadata, headers), so that a reload
	// under new settings applies them with the new files.
	opts Options
}

// node is one level of a domain's descriptor tree.
type node struct {
	// children by "key_value", or "key" for a key-only (any value) entry;
	// a '*' anywhere in either makes the entry a wildcard.
	children map[string]*node
	// wildcards are the children whose "key_value" holds a '*', in file
	// order (and load order across merged files): the first that matches
	// wins.
	wildcards []wildcard
	limit     *Limit
	// share is the wildcard value (e.g. "files*") when share_threshold is
	// set: every value the wildcard matches then shares one bucket.
	share string
}

// Limit is one configured rate_limit, as a drip token bucket.
type Limit struct {
	// Path is the descriptor's place in the config, as envoyproxy/ratelimit
	// names it in stats: "domain.key_value.key".
	Path string
	// Name is rate_limit.name, which replaces refers to.
	Name string
	// Replaces names the limits this one replaces when both apply.
	Replaces []string
	// Unlimited descriptors are always OK and never reach the store.
	Unlimited bool
	// Shadow descriptors are decided and counted but never deny.
	Shadow bool
	// Quota is the descriptor's quota_mode (or Options.Quota for every
	// limit): a quota descriptor over its limit does not deny the request
	// by itself. The request is over the limit when a descriptor without
	// quota mode is, or when every quota descriptor of the request is (a
	// quota limit in shadow mode never is); its descriptor status still
	// says OVER_LIMIT, and it takes nothing.
	Quota bool
	// Metadata is the descriptor's metadata, as a protobuf Struct (nil
	// when the descriptor has none). With Options.DynamicMetadata, the
	// metadata of the descriptors that were not over their limit is
	// returned in the response's dynamic metadata; nothing is decided on
	// it.
	Metadata *structpb.Struct
	// RequestsPerUnit and Unit are the limit as configured; a limit of 0
	// requests denies every request, as in envoyproxy/ratelimit.
	RequestsPerUnit uint32
	Unit            rlsv3.RateLimitResponse_RateLimit_Unit
	// Settle is drip's "settle: true" beside a rate_limit: a call that
	// gives this descriptor its own hits_addend above 0 charges work done
	// (as a SettleKey descriptor does: into bounded debt, never denied),
	// so that Envoy's apply_on_stream_done call needs no extra entry.
	// Its own hits_addend of 0 stays a check, and a call without one a
	// take.
	Settle bool
	// UnitMultiplier stretches the unit (request overrides only; 1 in files).
	UnitMultiplier uint32
	// Limit is the drip limit: a token bucket of RequestsPerUnit per unit
	// with a burst of RequestsPerUnit (or the file's drip "burst"),
	// Leased by the file's drip "leased" (or Options.Leased); zero when
	// Unlimited or RequestsPerUnit is 0.
	Limit drip.Limit

	// applied is the limit as the engine applies it (its rule: the
	// label, the mode; its limit compiled), copied for each request.
	applied engine.Applied
	// globalShadow: in shadow mode by SHADOW_MODE only. Its status says
	// OVER_LIMIT when it is over (the request is still allowed), as
	// envoyproxy/ratelimit's does; a limit's own shadow_mode says OK.
	globalShadow bool
}

// units maps envoyproxy/ratelimit's unit names to their durations (a month
// is 30 days and a year 365, as envoyproxy/ratelimit counts them).
var units = map[rlsv3.RateLimitResponse_RateLimit_Unit]time.Duration{
	rlsv3.RateLimitResponse_RateLimit_SECOND: time.Second,
	rlsv3.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	rlsv3.RateLimitResponse_RateLimit_HOUR:   time.Hour,
	rlsv3.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_MONTH:  30 * 24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_YEAR:   365 * 24 * time.Hour,
}

// newLimit completes l from its RequestsPerUnit, Unit and multiplier, with
// burst (0: RequestsPerUnit), algorithm ("" or drip.FixedWindow) and
// leased (drip.Limit.Leased; no effect on a limit of 0 or unlimited).
func newLimit(l *Limit, burst float64, algo drip.Algorithm, leased bool) error {
	if l.UnitMultiplier == 0 {
		l.UnitMultiplier = 1
	}
	if l.Unlimited {
		return nil
	}
	if l.RequestsPerUnit == 0 {
		l.prepare() // the zero Limit: a quota of 0, no window
		return nil
	}
	d, ok := units[l.Unit]
	if !ok {
		return fmt.Errorf("invalid rate limit unit %q", l.Unit)
	}
	l.Limit = drip.Limit{Rate: float64(l.RequestsPerUnit), Period: d * time.Duration(l.UnitMultiplier), Burst: burst, Leased: leased}
	if algo == drip.FixedWindow {
		// Windows on the unit's grid from the epoch, as envoyproxy/ratelimit
		// counts them.
		l.Limit.Algorithm, l.Limit.Start = drip.FixedWindow, l.Limit.Period
	}
	if err := l.Limit.Validate(); err != nil {
		return err
	}
	l.prepare()
	return nil
}

// prepare makes l's engine rule: its label, its mode, its limit
// compiled (the zero Limit for a limit of 0, which allows nothing).
func (l *Limit) prepare() {
	mode := rules.Enforce
	if l.Shadow {
		mode = rules.Shadow
	}
	l.applied = engine.NewApplied(&rules.Rule{Name: l.Label(), Mode: mode, Limit: l.Limit})
}

// Label is what l's decisions are counted under: its name, else its Path.
func (l *Limit) Label() string {
	if l.Name != "" {
		return l.Name
	}
	return l.Path
}

// blocks reports whether l denies every request (requests_per_unit 0).
func (l *Limit) blocks() bool { return !l.Unlimited && l.RequestsPerUnit == 0 }

// Domains returns the configured domains, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Files returns the files the config was loaded from, in load order.
func (c *Config) Files() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.files)
}

// Limits returns every configured limit, sorted by Path (which begins
// with the domain): what the service's decisions are counted under, known
// before any request.
func (c *Config) Limits() []*Limit {
	if c == nil {
		return nil
	}
	var out []*Limit
	var walk func(*node)
	walk = func(n *node) {
		if n.limit != nil {
			out = append(out, n.limit)
		}
		for _, ch := range n.children {
			walk(ch)
		}
	}
	for _, d := range c.domains {
		walk(d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Error is the old name of rules.Error, the error of a configuration
// that cannot be used.
//
// Deprecated: use rules.Error, which errors.As finds in the errors of
// Parse and Load; each of its Problems names its file.
type Error = rules.Error

// configError is a configuration that failed to load: its text is
// "envoy ratelimit config: " and every problem found, each as
// "file:line: path: message"; it wraps the rules.Error.
type configError struct{ err *rules.Error }

func (e *configError) Unwrap() error { return e.err }

func (e *configError) Error() string {
	lines := make([]string, len(e.err.Problems))
	for i, p := range e.err.Problems {
		lines[i] = p.File
		if p.Line > 0 {
			lines[i] += ":" + strconv.Itoa(p.Line)
		}
		lines[i] += ": " + p.String()
	}
	if len(lines) == 1 {
		return "envoy ratelimit config: " + lines[0]
	}
	return "envoy ratelimit config: " + strconv.Itoa(len(lines)) + " problems:\n  " + strings.Join(lines, "\n  ")
}

// IsConfig reports whether data is an envoyproxy/ratelimit configuration
// file: a YAML (or JSON) mapping with a top-level "domain" or
// "descriptors" key (a file with descriptors but no domain is a broken
// envoy file, and is reported as one). drip's own rules files have "rules"
// instead.
func IsConfig(data []byte) bool {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return false
	}
	m := doc.Content[0]
	if m.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if k := m.Content[i].Value; k == "domain" || k == "descriptors" {
			return true
		}
	}
	return false
}

// File is one configuration file's name and content.
type File struct {
	Name string
	Data []byte
	// Doc, when set, is the file already decoded, as a YAML document
	// node, and Data is not read: the xDS client builds its resources
	// so, without writing them out and reading them back. Its nodes carry
	// no line numbers, so problems name their path only.
	Doc *yaml.Node
}

// Parse builds a Config from configuration files, one domain each, in
// envoyproxy/ratelimit's format; two files of one domain are an error, as
// in envoyproxy/ratelimit by default. Every problem of every file is
// reported at once, in a *rules.Error (errors.As finds it).
func Parse(files ...File) (*Config, error) { return ParseWith(Options{}, files...) }

// ParseWith is Parse with options: with MergeDomains, files of one domain
// add their descriptors to it (a descriptor repeated across them is an
// error), in file order; with Shadow, every limit is in shadow mode; with
// Algorithm drip.FixedWindow, every limit without its own "algorithm" is
// a fixed window. The Config keeps opts: a Service deciding with it
// answers as Quota, DynamicMetadata and Headers say.
func ParseWith(opts Options, files ...File) (*Config, error) {
	c := &Config{domains: map[string]*node{}, opts: opts}
	var problems []rules.Issue
	domainFile := map[string]string{}
	for _, f := range files {
		p := &parser{file: f.Name, shadow: opts.Shadow, algo: opts.Algorithm, leased: opts.Leased}
		domain, descs := p.parse(f)
		if domain != "" {
			root := c.domains[domain]
			if other, dup := domainFile[domain]; dup && !opts.MergeDomains {
				p.add("domain", "duplicate domain %q (also in %s)", domain, other)
				root = nil
			} else if !dup {
				domainFile[domain] = f.Name
				root = &node{children: map[string]*node{}}
				c.domains[domain] = root
			}
			if root != nil && descs != nil {
				p.descriptors(root, descs, "descriptors", domain+".")
			}
		}
		problems = append(problems, p.problems...)
		c.files = append(c.files, f.Name)
	}
	if len(problems) > 0 {
		return nil, &configError{&rules.Error{Problems: problems}}
	}
	return c, nil
}

// Load reads a configuration file, or every *.yaml, *.yml and *.json file
// of a directory (as envoyproxy/ratelimit loads one file per domain), and
// parses it. Files whose names begin with '.' are skipped.
func Load(path string) (*Config, error) { return LoadWith(path, Options{IgnoreDotfiles: true}) }

// LoadWith is Load with options. Unless opts.IgnoreDotfiles, the dotfiles
// of a directory are loaded too, as envoyproxy/ratelimit loads them, when
// they are envoyproxy/ratelimit files (see IsConfig).
func LoadWith(path string, opts Options) (*Config, error) {
	names, err := ConfigFilesWith(path, !opts.IgnoreDotfiles)
	if err != nil {
		return nil, err
	}
	files := make([]File, 0, len(names))
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		if n != path && IsDotfile(n) && !IsConfig(b) {
			continue
		}
		files = append(files, File{Name: n, Data: b})
	}
	return ParseWith(opts, files...)
}

// ConfigFiles lists the files at path: path itself when it is a file, or
// the *.yaml, *.yml and *.json files of a directory (not its
// subdirectories nor dotfiles), sorted by name.
func ConfigFiles(path string) ([]string, error) { return ConfigFilesWith(path, false) }

// IsDotfile reports whether the file's name begins with '.'.
func IsDotfile(name string) bool { return strings.HasPrefix(filepath.Base(name), ".") }

// ConfigFilesWith is ConfigFiles, with the dotfiles of a directory when
// dotfiles is set.
func ConfigFilesWith(path string, dotfiles bool) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") && !dotfiles {
			continue
		}
		switch strings.ToLower(filepath.Ext(n)) {
		case ".yaml", ".yml", ".json":
		default:
			continue
		}
		full := filepath.Join(path, n)
		if st, err := os.Stat(full); err != nil || !st.Mode().IsRegular() {
			continue
		}
		out = append(out, full)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no *.yaml, *.yml or *.json file in the directory", path)
	}
	return out, nil
}
