// Package rules reads drip's rules files (docs/rules.md). A file says
// which requests are limited, by which keys, under which limits, and what
// to do when the store fails. Files are JSON or YAML, decoded strictly:
// unknown fields are errors. Every issue is reported at once, with its
// line and path (rules.yaml:12: rules[2].algorithm_config.burst: must be
// > 0).
//
// A Set is immutable once loaded. A reload builds a new Set and swaps it
// in whole. The same loader backs drip check, drip serve and the front
// doors.
package rules

import (
	"crypto"
	_ "embed"
	"fmt"
	"github.com/driplimit/drip/internal/llm"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/driplimit/drip"
)

// Mode is whether a rule blocks.
type Mode string

const (
	// Enforce rules deny requests over the limit (429). The default.
	Enforce Mode = "enforce"
	// Shadow rules are decided and counted but never block.
	Shadow Mode = "shadow"
)

// OnError is what a rule does when the store fails or times out.
type OnError string

const (
	// Allow lets the request through (logged and counted). The default.
	Allow OnError = "allow"
	// Deny answers 503.
	Deny OnError = "deny"
	// Local falls back to a per-instance memory limiter at LocalShare of
	// the rule's rate and burst, behind a circuit breaker, until the store
	// is back.
	Local OnError = "local"
)

// Defaults of the global settings.
const (
	DefaultIPv6Prefix      = 64
	DefaultLocalShare      = 0.5
	DefaultBreakerFailures = 5
	DefaultBreakerRatio    = 0.5
	DefaultBreakerStall    = 750 * time.Millisecond
	DefaultBreakerCooldown = 500 * time.Millisecond
	defaultCost            = 1.0
	maxRuleName            = 128
	maxNestingDepth        = 64
	maxYAMLNodes           = 100_000
)

// Set is a loaded rules file, built by Parse or Load (which fill in every
// default and check everything). It is immutable: do not modify it or
// what it holds; a reload builds a new Set.
type Set struct {
	// Rules in file order.
	Rules []Rule
	// JWT says how bearer tokens are verified; nil when the file has no
	// "jwt" setting (then no rule uses jwt: sources).
	JWT *JWT
	// TrustedProxies are the proxies whose X-Forwarded-For is believed.
	// Empty: the client IP is the peer address.
	TrustedProxies []netip.Prefix
	// IPv6Prefix is the prefix length by which IPv6 clients are keyed
	// (default 64): one client usually holds a whole /64.
	IPv6Prefix int
	// OnError is the default fail policy of rules that set none.
	OnError OnError
	// LocalShare is the default share of a rule's rate and burst that the
	// local fallback grants (0 < share <= 1, default 0.5).
	LocalShare float64
	// StoreTimeout is the deadline of each store call; zero leaves it to
	// the engine's option (engine.WithTimeout).
	StoreTimeout time.Duration
	// Breaker configures the circuit breaker in front of the store.
	Breaker Breaker
	// RetryJitter spreads the Retry-After of denied requests over clients
	// (retry_after_jitter; default DefaultJitter: up to 50% of
	// the wait, at most 60 s).
	RetryJitter Jitter
	// ExactPaths is the file's exact_paths: request paths keep their case
	// and their segments' trailing dots and spaces (CleanPath). False, the
	// default, folds case and drops them. A rule on /admin/* then holds on
	// apps that route /ADMIN/ or /admin./ there (ASP.NET, Express, IIS).
	ExactPaths bool
	// File is the name the set was loaded from.
	File string
	// KeySecretEnv (key_secret_env) names the environment variable that
	// holds the secret of hashed limit keys ("hash:header:x-api-key");
	// KeySecret is that secret, read by the loader (Load, ParseEnv).
	KeySecretEnv string
	KeySecret    []byte
	// Prices (prices) is the file's price table, which the rules that
	// count a call's price ("openai:money") read; nil when it has none.
	Prices *llm.Prices

	byName map[string]int
}

// Breaker configures the circuit breaker in front of the store. It opens
// when the store is down, not when calls are slow. It opens when, within
// a second, at least Failures calls failed, and they were at least
// FailureRatio of the calls. A call that missed its deadline while the
// store answered others is slow, not failed. It also opens when a call
// has waited Stall without the store answering anything. Zero Stall is
// DefaultBreakerStall, or half the store deadline if that is longer.
// Open, the store is not called for Cooldown; then one probe decides.
type Breaker struct {
	Failures     int
	FailureRatio float64
	Stall        time.Duration
	Cooldown     time.Duration
}

// DefaultBreaker is the breaker of a rules file that configures none.
var DefaultBreaker = Breaker{Failures: DefaultBreakerFailures, FailureRatio: DefaultBreakerRatio,
	Cooldown: DefaultBreakerCooldown}

// Or is b with def's value for every field b leaves at zero.
func (b Breaker) Or(def Breaker) Breaker {
	if b.Failures <= 0 {
		b.Failures = def.Failures
	}
	if b.FailureRatio <= 0 {
		b.FailureRatio = def.FailureRatio
	}
	if b.Stall <= 0 {
		b.Stall = def.Stall
	}
	if b.Cooldown <= 0 {
		b.Cooldown = def.Cooldown
	}
	return b
}

// JWT says how bearer tokens are verified. Exactly one way is set:
// HMACSecret, Keys, or Verify false.
type JWT struct {
	// Verify is false only when the file says "verify": false: claims are
	// then read without checking the signature (a gateway in front has).
	// Expiry (exp, nbf) is checked either way.
	Verify bool
	// HMACSecretEnv, PublicKeyFiles and JWKSFile say where the secret or
	// keys are: an environment variable, key files, a JWKS file. Paths
	// are relative to the rules file's directory.
	HMACSecretEnv  string
	PublicKeyFiles []string
	JWKSFile       string
	// HMACSecret is the secret read from HMACSecretEnv, and Keys the
	// public keys of PublicKeyFiles or JWKSFile, by the loader (Load,
	// ParseEnv); Parse leaves them empty.
	HMACSecret []byte
	Keys       []PublicKey
	// Issuer and Audience, when set, must match the token's iss and aud.
	Issuer   string
	Audience string
	// Leeway is the clock skew allowed when checking exp and nbf.
	Leeway time.Duration
}

// PublicKey is one verification key: an *rsa.PublicKey,
// *ecdsa.PublicKey or ed25519.PublicKey, with its JWKS key id and
// algorithm when it came from a JWKS file.
type PublicKey struct {
	ID  string
	Alg string
	Key crypto.PublicKey
}

// Rule is one rule of a Set.
type Rule struct {
	// Name identifies the rule: in bucket keys, headers, metrics and the
	// decision API. Unique within a Set.
	Name string
	// Group: within a group only the first matching rule (in file order)
	// applies. Empty: the rule is in no group.
	Group string
	// LimitKeys are the sources whose values, with the name, make the
	// bucket key. A request lacking one of them (or with it empty) is not
	// limited by this rule, and the next rule of its group may apply.
	LimitKeys []Source
	// Match holds conditions that must all hold for the rule to apply.
	Match []Condition
	// Mode is Enforce or Shadow.
	Mode Mode
	// Limit is the rule's limit: its algorithm and algorithm_config, and
	// Leased for "leased": true. MaxReserved is 0 unless the rule sets
	// max_reserved. A rule at 0 allows no reservation: the decision API
	// refuses "reserve": true. For drip.Limit itself, 0 means no bound.
	Limit drip.Limit
	// CostSource is where a request's cost is read: Kind KindFixed (cost
	// FixedCost), KindHeader or KindQuery.
	CostSource Source
	// FixedCost is the cost of every request when CostSource is fixed.
	FixedCost float64
	// MinCost (min_cost) is the least a request costs, whatever its cost
	// source or its response says. Neither its estimate nor its settled
	// cost is below it.
	MinCost float64
	// Budget is Soft (or empty, the default) or Strict (budget: strict).
	// A strict rule takes the most its request can cost (a cost_source of
	// KindBound). It refuses a request with no such bound, and settles
	// without debt.
	Budget Budget
	// DefaultCost is the cost when the header or query value is absent,
	// not a number, negative or not finite.
	DefaultCost float64
	// OnError is the rule's fail policy (the file's default when unset).
	OnError OnError
	// LocalShare is the share of Limit's rate and burst that the local
	// fallback grants.
	LocalShare float64
	// Claims, when set, reads the rate and burst of a request's bucket
	// from its verified token's claims (limit_from_claims; see LimitFor).
	Claims *ClaimLimit
	// CostFrom (cost_from_response) is where the response tells the
	// request's actual cost. The request takes an estimate (CostSource)
	// before it is served. The door settles the difference when the
	// response ends.
	CostFrom *ResponseSource
	// CountStatus (count_status) makes the rule count only the responses
	// whose status is in the set. Before the request, its bucket is only
	// peeked at the cost. The cost is taken after a matching response.
	CountStatus StatusSet
	// LogKey (log_key) is how the log of denials shows the rule's keys.
	// LogKeyHash, or "", shows a short hash. LogKeyRedact hides them.
	// LogKeyPlain shows them as they are.
	LogKey string
	// MaxWait (max_wait) is how long a request this rule would deny may
	// wait for its turn instead. A rate rule's request holds a
	// reservation; a concurrency rule's waits for a slot. Zero answers at
	// once.
	MaxWait time.Duration
	// MaxQueue is how many requests may wait under the rule at once in
	// one instance (max_queue; DefaultMaxQueue with max_wait alone): a
	// request beyond it is denied at once.
	MaxQueue int
	// Adaptive is the algorithm_config of an adaptive rule (algorithm:
	// adaptive): its in-flight limit is learned in each instance, and
	// Limit is then a concurrency limit of Adaptive.MaxLimit slots. Nil
	// for every other rule.
	Adaptive *Adaptive
	// Priority (priority), when PrioritySet, is the class of the rule's
	// requests, from 0 (batch) to 100 (critical); else they are of
	// PriorityDefault (Class). A request may name its own (PriorityFrom).
	Priority    int
	PrioritySet bool
	// PriorityFrom (priority_from), when set, is where a request names
	// its class (ParsePriority; a value it cannot read is Priority).
	PriorityFrom *Source
	// Reserve (reserve) is the share of the rule's capacity that only
	// critical requests may use (Share); DefaultReserve when the rule
	// names priorities and sets none, else 0.
	Reserve float64
	// Index is the rule's position in the file.
	Index int

	keySecret []byte // the file's KeySecret, for hashed limit keys
}

// The values of a rule's log_key.
const (
	LogKeyHash   = "hash"
	LogKeyRedact = "redact"
	LogKeyPlain  = "plain"
)

// Budget is how a rule that settles on its response holds its limit.
type Budget string

const (
	// Soft: the estimate is taken before the request, and the response's
	// cost is settled into bounded debt.
	Soft Budget = "soft"
	// Strict: the worst case is taken before the request, and the
	// response's cost is refunded down from it: the limit is never
	// exceeded.
	Strict Budget = "strict"
)

// Rule returns the rule called name.
func (s *Set) Rule(name string) (*Rule, bool) {
	if s.byName == nil { // a Set built by hand rather than by Parse
		for i := range s.Rules {
			if s.Rules[i].Name == name {
				return &s.Rules[i], true
			}
		}
		return nil, false
	}
	i, ok := s.byName[name]
	if !ok {
		return nil, false
	}
	return &s.Rules[i], true
}

// UsesJWT reports whether any rule reads jwt: claims.
func (s *Set) UsesJWT() bool {
	for i := range s.Rules {
		if s.Rules[i].usesJWT() {
			return true
		}
	}
	return false
}

// ReadsPath reports whether a rule matches or keys on the request's
// path. Only then do the HTTP doors read it (CleanPath) and refuse an
// ambiguous one.
func (s *Set) ReadsPath() bool {
	for i := range s.Rules {
		r := &s.Rules[i]
		for _, k := range r.LimitKeys {
			if k.Kind == KindPath {
				return true
			}
		}
		for _, c := range r.Match {
			if c.Source.Kind == KindPath {
				return true
			}
		}
	}
	return false
}

func (r *Rule) usesJWT() bool {
	for _, k := range r.LimitKeys {
		if k.Kind == KindJWT {
			return true
		}
	}
	for _, c := range r.Match {
		if c.Source.Kind == KindJWT {
			return true
		}
	}
	return r.Claims != nil
}

// Issue is one thing wrong in a rules file: where it is and what.
type Issue struct {
	// Path locates it, such as rules[2].algorithm_config.burst; empty
	// for the whole file.
	Path    string
	Message string
	// Line is the line of the file it is on; 0 when unknown.
	Line int
	// File is the file it is in, when its Error spans several files (an
	// envoyproxy/ratelimit configuration); empty: the Error's File.
	File string
}

// Problem is the old name of Issue.
//
// Deprecated: use Issue. Problem now names only the problem+json body of
// a denial (httplimit.Problem).
type Problem = Issue

// String returns the path and the message.
func (p Issue) String() string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// Error is a rules file that cannot be used, with every issue found. It
// is also the error of an envoyproxy/ratelimit configuration (package
// server/envoy), whose issues each name their file.
type Error struct {
	File string
	// Problems lists every issue found.
	Problems []Issue
}

// Error lists the problems one per line, each as "file:line: path:
// message" (the line and the path when known), as compilers and drip's
// envoyproxy/ratelimit config errors write them.
func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		file := p.File
		if file == "" {
			file = e.File
		}
		if file != "" {
			b.WriteString(file)
			if p.Line > 0 {
				b.WriteString(":" + strconv.Itoa(p.Line))
			}
			b.WriteString(": ")
		} else if p.Line > 0 {
			b.WriteString("line " + strconv.Itoa(p.Line) + ": ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Env is what the loader reads besides the rules file: the environment
// variable of a jwt section's hmac_secret_env, and its key files.
type Env struct {
	Getenv   func(name string) string
	ReadFile func(path string) ([]byte, error)
}

// OSEnv is the process's environment and file system.
var OSEnv = Env{Getenv: os.Getenv, ReadFile: os.ReadFile}

// Load reads and parses the rules file at path, with the process's
// environment (ParseEnv with OSEnv). Key files named in it are read
// relative to the file's directory.
func Load(path string) (*Set, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	return ParseEnv(data, path, OSEnv)
}

// Parse decodes and validates a rules file. name tells the format:
// .json, .yaml or .yml; else it is sniffed (JSON starts with '{'). name
// also names the file in errors, and is the base of relative key file
// paths. A bad file gives an *Error listing every issue.
//
// Parse has no side effects: it reads no environment variable and no
// file. A jwt section's secret and keys are named in the Set
// (JWT.HMACSecretEnv, PublicKeyFiles, JWKSFile) but not read: use
// ParseEnv or Load for a Set that verifies tokens.
func Parse(data []byte, name string) (*Set, error) { return parse(data, name, nil) }

// ParseEnv is Parse, then reads a jwt section's secret and key files
// from env. A missing variable or a bad key file is an issue of the
// file, with its line.
func ParseEnv(data []byte, name string, env Env) (*Set, error) { return parse(data, name, &env) }

func parse(data []byte, name string, env *Env) (*Set, error) {
	v, lines, problems := decode(data, name)
	if len(problems) > 0 {
		return nil, &Error{File: name, Problems: withLines(problems, lines)}
	}
	c := &checker{file: name, env: env}
	set := c.set(v)
	if len(c.problems) > 0 {
		return nil, &Error{File: name, Problems: withLines(c.problems, lines)}
	}
	set.File = name
	return set, nil
}

// DefaultJSON is the rules file drip serve uses when given none. Every
// client IP gets a token bucket of 10 requests per second, with bursts of
// 20. A shadow rule counts how often all traffic would exceed 1000 per
// second.
//
//go:embed default.json
var DefaultJSON []byte

// Default returns the parsed DefaultJSON.
func Default() *Set {
	s, err := Parse(DefaultJSON, "default.json")
	if err != nil {
		panic("rules: the built-in default is invalid: " + err.Error())
	}
	return s
}
