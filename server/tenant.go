package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"math/big"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/door/frontdoor"
	"github.com/driplimit/drip/internal/llm"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/rules"
)

// A tenant's whole picture on the admin listener:
//   POST /v1/admin/tenant  {"ip": "203.0.113.7", "headers": {"x-api-key": "k1"},
//                           "claims": {"plan": "pro"}, "query": {...}, "cookies": {...},
//                           "path": "/api/x", "method": "GET"}
// Every rule in force, in file order: whether a request carrying these
// values falls under it (and why not), its bucket key, the limit in force
// (the key's override, else limit_from_claims, else the rule's), the
// override of the key and whether it is stale, and the bucket now: a
// peek at cost 0, which takes nothing (a concurrency rule's: the slots
// held), with what it has spent and what is left (tenantSpend), in
// micro-units and in the currency's units for a rule that counts a
// call's price. An API key (api_key) is read from the headers given
// ("authorization": "Bearer sk-...", or "x-api-key"), hashed as
// requests' are. Claims are taken as given: the operator names them, no token is
// verified. The IP is read as the peer's address (trusted proxies do not
// apply: there is no hop to skip).

// maxTenantBody bounds the body; maxTenantValues the entries of each of
// its maps.
const (
	maxTenantBody   = 16 << 10
	maxTenantValues = 64
)

// tenantAsk is what a request would carry.
type tenantAsk struct {
	IP      string            `json:"ip"`
	Headers map[string]string `json:"headers"`
	Claims  map[string]string `json:"claims"`
	Query   map[string]string `json:"query"`
	Cookies map[string]string `json:"cookies"`
	Path    string            `json:"path"`
	Method  string            `json:"method"`

	set     *rules.Set
	headers map[string]string // by canonical name
}

// Value reads the values as a front door reads a request's.
func (a *tenantAsk) Value(src rules.Source) (string, bool) {
	var v string
	var ok bool
	switch src.Kind {
	case rules.KindIP:
		ip, err := netip.ParseAddr(a.IP)
		if err != nil {
			return "", false
		}
		return frontdoor.KeyIP(ip.Unmap(), a.set.IPv6Prefix), true
	case rules.KindHeader:
		v, ok = a.headers[src.Name]
	case rules.KindJWT:
		v, ok = a.Claims[src.Name]
	case rules.KindQuery:
		v, ok = a.Query[src.Name]
	case rules.KindCookie:
		v, ok = a.Cookies[src.Name]
	case rules.KindPath:
		p, err := a.set.CleanPath(a.Path)
		return p, err == nil && a.Path != ""
	case rules.KindMethod:
		return rules.CleanMethod(a.Method), a.Method != ""
	case rules.KindGlobal:
		return "", true
	case rules.KindAPIKey:
		h := make(map[string][]string, len(a.headers))
		for k, v := range a.headers {
			h[k] = []string{v}
		}
		return (&frontdoor.Base{Header: h}).Value(src)
	}
	return v, ok
}

func (a *tenantAsk) Identity(key string) string { return "key:" + key }

// Cost is 0, false: no rule here costs by a program's function.
func (a *tenantAsk) Cost(*rules.Rule) (float64, bool) { return 0, false }

// tenantRule is one rule of the picture.
type tenantRule struct {
	Rule    string `json:"rule"`
	Group   string `json:"group,omitempty"`
	Mode    string `json:"mode"`
	Applies bool   `json:"applies"`
	// Why a rule does not apply.
	Why   string      `json:"why,omitempty"`
	Key   string      `json:"key,omitempty"`
	Limit *drip.Limit `json:"limit,omitempty"`
	// LimitFrom says whose limit is in force: "override",
	// "limit_from_claims" or "rule".
	LimitFrom string `json:"limit_from,omitempty"`
	// Override is the key's override, if it has one; Stale says why it
	// does not apply.
	Override *override.Entry `json:"override,omitempty"`
	Stale    string          `json:"stale,omitempty"`
	// Decision is the bucket now (a peek at cost 0); InFlight, for a
	// concurrency rule, the slots held.
	Decision *drip.Decision `json:"decision,omitempty"`
	InFlight *int64         `json:"in_flight,omitempty"`
	// Spend is what the bucket has spent and what is left, in the
	// rule's unit (a concurrency rule has none).
	Spend *tenantSpend `json:"spend,omitempty"`
}

// tenantSpend is a bucket's spend: Spent is its burst less what it
// holds (in a fixed or calendar window, what the window's requests
// took; in a token bucket, what it has yet to refill), Left what it
// holds (below 0: a soft budget's debt), both in Unit: "micro-units" of
// a currency for a rule that counts a call's price, "tokens" for one
// that counts a model server's tokens, "requests" for a rule whose
// every request costs one, else "cost". A money rule's are also in the
// currency's units (SpentUnits, LeftUnits: decimals, exact). When the
// window starts again is the decision's reset_after.
type tenantSpend struct {
	Unit       string  `json:"unit"`
	Spent      float64 `json:"spent"`
	Left       float64 `json:"left"`
	Of         float64 `json:"of"`
	SpentUnits string  `json:"spent_units,omitempty"`
	LeftUnits  string  `json:"left_units,omitempty"`
}

func (s *Server) adminTenant(w http.ResponseWriter, r *http.Request) {
	var a tenantAsk
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxTenantBody))
	if err != nil {
		writeError(w, inputf("the body is over %d bytes", maxTenantBody))
		return
	}
	if !utf8.Valid(b) {
		writeError(w, inputf("the body is not valid UTF-8"))
		return
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		writeError(w, inputf("bad JSON: %v", err))
		return
	}
	for _, m := range []map[string]string{a.Headers, a.Claims, a.Query, a.Cookies} {
		if len(m) > maxTenantValues {
			writeError(w, inputf("at most %d headers, claims, query parameters or cookies each", maxTenantValues))
			return
		}
	}
	a.set = s.rules()
	a.headers = make(map[string]string, len(a.Headers))
	for k, v := range a.Headers {
		a.headers[textproto.CanonicalMIMEHeaderKey(k)] = v
	}
	out, err := s.tenant(r.Context(), &a)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"rules": out})
}

// tenant is the picture of a request carrying a's values: the rules
// matched as engine.Decide matches them, their buckets peeked in one
// store call.
func (s *Server) tenant(ctx context.Context, a *tenantAsk) ([]tenantRule, error) {
	set := a.set
	ovr := s.eng.Overrides()
	out := make([]tenantRule, len(set.Rules))
	var reqs []drip.Request
	var plans []*engine.Plan
	var at []int
	var groups []string
	for i := range set.Rules {
		ru := &set.Rules[i]
		t := tenantRule{Rule: ru.Name, Group: ru.Group, Mode: string(ru.Mode)}
		vals, ok := ru.KeyValues(a.Value)
		switch {
		case ru.Group != "" && slices.Contains(groups, ru.Group):
			t.Why = "an earlier rule of group " + ru.Group + " applies"
		case !ru.Matches(a.Value):
			t.Why = "its match does not hold"
		case !ok:
			t.Why = "a limit key has no value: " + sourceList(ru.KeySources())
		default:
			if ru.Group != "" {
				groups = append(groups, ru.Group)
			}
			t.Applies, t.Key = true, ru.Key(vals)
			l, own := s.eng.LimitOf(ru, t.Key, a.Value)
			t.LimitFrom = "rule"
			if e, ok := ovr.Entry(t.Key); ok {
				t.Override = &e
				t.Stale = engine.Stale(ru, e.Limit)
			}
			switch {
			case own && t.Override != nil && t.Stale == "":
				t.LimitFrom = "override"
			case own:
				t.LimitFrom = "limit_from_claims"
			}
			t.Limit = &l
			var pl *engine.Plan // an override's, or limit_from_claims's: compiled for the call
			if !own {
				pl = s.plan(ru)
			}
			reqs, plans = append(reqs, drip.Request{Key: t.Key, Limit: l, Cost: 0}), append(plans, pl)
			at = append(at, i)
		}
		out[i] = t
	}
	if len(reqs) == 0 {
		return out, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	defer cancel()
	m, err := s.eng.Apply(ctx, bucket.Peek, reqs, plans)
	if err != nil {
		return nil, err
	}
	for j, i := range at {
		d := m.Decisions[j]
		out[i].Decision = &d
		if reqs[j].Limit.Algorithm == drip.Concurrency {
			held := int64(reqs[j].Limit.MaxInFlight) - d.Remaining
			out[i].InFlight = &held
			continue
		}
		out[i].Spend = spendOf(&set.Rules[i], d)
	}
	return out, nil
}

func sourceList(srcs []rules.Source) string {
	names := make([]string, len(srcs))
	for i, s := range srcs {
		names[i] = s.String()
	}
	return strings.Join(names, ", ")
}

// spendOf is the spend of rule's bucket, d.
func spendOf(ru *rules.Rule, d drip.Decision) *tenantSpend {
	// To the millionth, the bucket's precision (no 0.45406499999999994).
	micro := func(x float64) float64 { return math.Round(x*1e6) / 1e6 }
	sp := &tenantSpend{Unit: "cost", Of: d.Burst, Left: micro(d.Tokens), Spent: micro(d.Burst - d.Tokens)}
	name := ""
	switch {
	case ru.CostSource.Kind == rules.KindBound:
		name = ru.CostSource.Name
	case ru.CostFrom != nil && ru.CostFrom.API != "":
		name = ru.CostFrom.API
	}
	switch _, part, ok := llm.ParseName(name); {
	case ok && part == llm.Money:
		sp.Unit = "micro-units"
		sp.SpentUnits, sp.LeftUnits = units(sp.Spent), units(sp.Left)
	case ok:
		sp.Unit = "tokens"
	case ru.CostSource.Kind == rules.KindFixed && ru.FixedCost == 1 && ru.CostFrom == nil:
		sp.Unit = "requests"
	}
	return sp
}

// units is an amount of micro-units in the currency's units, exactly
// (to the micro-unit: the bucket's own precision): 1234567 is "1.234567".
func units(micro float64) string {
	return new(big.Rat).SetFrac64(int64(math.Round(micro)), 1_000_000).FloatString(6)
}
