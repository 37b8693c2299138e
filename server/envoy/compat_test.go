package envoy

import (
	"context"
	"errors"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// The compatibility suite: every configuration that envoyproxy/ratelimit's
// own config tests load or reject, and every lookup they make, rewritten
// here with configurations of drip's own that have the same shape (other
// names, same structure and limits). Each case names the upstream test it
// stands for. A case either loads (and then every lookup must pick the
// limit upstream picks: the same place in the config, requests per unit,
// unit, name, modes, share_threshold patterns and metadata) or is
// rejected, as upstream rejects it.

// want is the limit a lookup must find; a zero want (path "") is no limit.
type want struct {
	path      string
	rpu       uint32
	unit      rlsv3.RateLimitResponse_RateLimit_Unit
	name      string
	unlimited bool
	shadow    bool
	quota     bool
	shared    []string // share_threshold pattern per entry ("" where none)
	metadata  string   // the metadata as JSON, "" for none
}

// lookup is one descriptor looked up in a loaded case.
type lookup struct {
	domain  string
	entries []string // "key=value"
	want    want
}

type compatCase struct {
	name    string // the envoyproxy/ratelimit test it stands for
	merge   bool   // MERGE_DOMAIN_CONFIG
	files   []string
	loads   bool
	lookups []lookup
}

const (
	second = rlsv3.RateLimitResponse_RateLimit_SECOND
	minute = rlsv3.RateLimitResponse_RateLimit_MINUTE
	hour   = rlsv3.RateLimitResponse_RateLimit_HOUR
	day    = rlsv3.RateLimitResponse_RateLimit_DAY
)

// shopConfig stands for upstream's basic configuration: a value with no
// limit of its own whose children are limited (a key alone, and a value
// that overrides it), a key alone beside its values (one with a higher
// limit, one with none at all), a named limit, a limit at a level with
// children, an unlimited key and a detailed_metric one.
const shopConfig = `
domain: shop
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: user
        value: admin
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: plan
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: plan
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: plan
    value: internal
  - key: region
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: report
    rate_limit: {name: daily_report, unit: day, requests_per_unit: 1}
  - key: export
    value: csv
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: format
        value: gzip
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: health
    rate_limit: {unlimited: true}
  - key: search
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
`

// mailSenders and mailRecipients stand for upstream's two files of one
// domain, merged under MERGE_DOMAIN_CONFIG.
const (
	mailSenders = `
domain: mail
descriptors:
  - key: sender
    value: alice
    rate_limit: {unit: minute, requests_per_unit: 10}
`
	mailRecipients = `
domain: mail
descriptors:
  - key: recipient
    value: bob
    rate_limit: {unit: minute, requests_per_unit: 20}
`
)

// globConfig stands for upstream's wildcard configuration: a trailing
// '*', a value without one, a key alone, a '*' in the middle, several
// '*', and a wildcard one level down.
const globConfig = `
domain: cdn
descriptors:
  - key: asset
    value: img*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: exact
    value: img
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: anyvalue
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: middle
    value: ab*z
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: several
    value: img*web*png
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: zone
    value: eu
    descriptors:
      - key: asset
        value: vid*
        rate_limit: {unit: minute, requests_per_unit: 20}
`

// sharedConfig stands for upstream's share_threshold configuration.
const sharedConfig = `
domain: store
descriptors:
  - key: doc
    value: docs/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: team
    value: red
    descriptors:
      - key: doc
        value: red/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 200}
  - key: doc
    value: outer/*
    share_threshold: true
    descriptors:
      - key: doc
        value: red/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: api
    value: v1/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: verb
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: svc
    value: svc/*
    share_threshold: true
    descriptors:
      - key: op
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: dir
    value: dir/*
    share_threshold: true
    descriptors:
      - key: blob
        value: blob/*
        share_threshold: false
        descriptors:
          - key: kind
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: member
    value: m/*
    share_threshold: true
    descriptors:
      - key: item
        value: i/*
        share_threshold: true
        descriptors:
          - key: verb
            rate_limit: {unit: minute, requests_per_unit: 150}
  - key: sheet
    value: q1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: sheet
    value: q*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: mid
    value: /v*x
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: multi
    value: a*b*c
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: midmetric
    value: /w*y
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 80}
  - key: org
    value: o*live
    share_threshold: true
    descriptors:
      - key: item
        value: i*2
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 60}
`

// chainConfig is the three-level chain of key-only descriptors many of
// upstream's value_to_metric tests share; metric flags change its stats,
// never its limit.
const chainConfig = `
domain: chain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: verb
        value_to_metric: true
        descriptors:
          - key: subject
            rate_limit: {unit: minute, requests_per_unit: 60}
`

func w(path string, rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit) want {
	return want{path: path, rpu: rpu, unit: unit}
}

func lk(domain string, wnt want, entries ...string) lookup {
	return lookup{domain: domain, entries: entries, want: wnt}
}

func compatCases() []compatCase {
	shared := func(wt want, patterns ...string) want { wt.shared = patterns; return wt }
	return []compatCase{
		{name: "TestBasicConfig", files: []string{shopConfig}, loads: true, lookups: []lookup{
			lk("elsewhere", want{}),
			lk("shop", want{}),
			lk("shop", want{}, "tenant=other"),
			lk("shop", want{}, "tenant=acme"),
			lk("shop", want{}, "plan=gold", "user=x"),
			lk("shop", want{}, "export=csv", "format=zip"),
			lk("shop", w("shop.tenant_acme.user", 5, second), "tenant=acme", "user=bob"),
			lk("shop", w("shop.tenant_acme.user_admin", 10, second), "tenant=acme", "user=admin"),
			lk("shop", w("shop.plan", 20, minute), "plan=free"),
			lk("shop", w("shop.plan_gold", 30, minute), "plan=gold"),
			lk("shop", want{}, "plan=internal"),
			lk("shop", w("shop.region", 1, hour), "region=eu"),
			lk("shop", want{path: "shop.report", rpu: 1, unit: day, name: "daily_report"}, "report=weekly"),
			lk("shop", want{path: "shop.health", unlimited: true}, "health=live"),
			lk("shop", w("shop.search", 70, minute), "search=shoes"),
			lk("shop", w("shop.search", 70, minute), "search=hats"),
		}},
		{name: "TestDomainMerge", merge: true, files: []string{mailSenders, mailRecipients}, loads: true, lookups: []lookup{
			lk("elsewhere", want{}),
			lk("mail", want{}),
			lk("mail", w("mail.sender_alice", 10, minute), "sender=alice"),
			lk("mail", w("mail.recipient_bob", 20, minute), "recipient=bob"),
		}},
		{name: "TestDuplicateDomain", files: []string{shopConfig, "domain: shop\ndescriptors:\n"}},
		{name: "TestDuplicateKeyDomainMerge", merge: true, files: []string{mailSenders, mailSenders}},
		{name: "TestEmptyDomain", files: []string{"descriptors:\n"}},
		{name: "TestEmptyKey", files: []string{"domain: shop\ndescriptors:\n  - value: acme\n"}},
		{name: "TestDuplicateKey", files: []string{"domain: shop\ndescriptors:\n  - key: tenant\n    value: acme\n  - key: tenant\n    value: acme\n"}},
		{name: "TestBadLimitUnit", files: []string{"domain: shop\ndescriptors:\n  - key: tenant\n    value: acme\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"}},
		{name: "TestReplacesSelf", files: []string{"domain: shop\ndescriptors:\n  - key: tenant\n    rate_limit:\n      name: me\n      replaces: [{name: me}]\n      unit: second\n      requests_per_unit: 5\n"}},
		{name: "TestReplacesEmpty", files: []string{"domain: shop\ndescriptors:\n  - key: tenant\n    rate_limit:\n      name: me\n      replaces:\n        - name:\n      unit: second\n      requests_per_unit: 5\n"}},
		{name: "TestBadYaml", files: []string{"\"unterminated\n"}},
		{name: "TestMisspelledKey", files: []string{"domain: shop\ndescriptors:\n  - key: tenant\n    ratelimits:\n      unit: day\n      requests_per_unit: 5\n"}},
		{name: "TestMisspelledKey (rate_limit)", files: []string{"domain: shop\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: day\n      requests_per_units: 5\n"}},
		{name: "TestNonStringKey", files: []string{"1.5: shop\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: day, requests_per_unit: 5}\n"}},
		{name: "TestNonMapList", files: []string{"domain: shop\ndescriptors:\n  - x\n  - y\n"}},
		{name: "TestUnlimitedWithRateLimitUnit", files: []string{"domain: shop\ndescriptors:\n  - key: tenant\n    rate_limit: {unlimited: true, unit: hour, requests_per_unit: 3}\n"}},
		{name: "TestShadowModeConfig", loads: true, files: []string{`
domain: shop
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: user
        value: admin
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: plan
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: plan
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 30}
`}, lookups: []lookup{
			lk("shop", w("shop.tenant_acme.user", 5, second), "tenant=acme", "user=bob"),
			lk("shop", want{path: "shop.tenant_acme.user_admin", rpu: 10, unit: second, shadow: true}, "tenant=acme", "user=admin"),
			lk("shop", want{path: "shop.plan", rpu: 20, unit: minute, shadow: true}, "plan=free"),
			lk("shop", w("shop.plan_gold", 30, minute), "plan=gold"),
		}},
		{name: "TestWildcardConfig", files: []string{globConfig}, loads: true, lookups: []lookup{
			lk("cdn", w("cdn.anyvalue", 20, minute), "anyvalue=img1"),
			lk("cdn", w("cdn.anyvalue", 20, minute), "anyvalue=img2"),
			lk("cdn", w("cdn.asset_img*", 20, minute), "asset=img1"),
			lk("cdn", w("cdn.asset_img*", 20, minute), "asset=img2"),
			lk("cdn", w("cdn.zone_eu.asset_vid*", 20, minute), "zone=eu", "asset=vid2"),
			lk("cdn", want{}, "asset=css"),
			lk("cdn", want{}, "exact=img1"),
			lk("cdn", w("cdn.middle_ab*z", 20, minute), "middle=abxz"),
			lk("cdn", w("cdn.middle_ab*z", 20, minute), "middle=ab987z"),
			lk("cdn", w("cdn.middle_ab*z", 20, minute), "middle=abz"),
			lk("cdn", want{}, "middle=abx"),
			lk("cdn", want{}, "middle=xabz"),
			lk("cdn", w("cdn.several_img*web*png", 10, minute), "several=img1web2png"),
			lk("cdn", w("cdn.several_img*web*png", 10, minute), "several=imgwebpng"),
			lk("cdn", want{}, "several=img1png"),
			lk("cdn", want{}, "several=web2png"),
		}},
		{name: "TestDetailedMetric (parent only, detailed)", files: []string{`
domain: nest
descriptors:
  - key: a
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 5}
`}, loads: true, lookups: []lookup{lk("nest", w("nest.a", 100, minute), "a=1")}},
		{name: "TestDetailedMetric (parent only)", files: []string{`
domain: nest
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 5}
`}, loads: true, lookups: []lookup{lk("nest", w("nest.a", 100, minute), "a=1")}},
		{name: "TestDetailedMetric (both, detailed)", files: []string{`
domain: nest
descriptors:
  - key: a
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: b
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
`}, loads: true, lookups: []lookup{lk("nest", w("nest.a.b", 5, minute), "a=1", "b=2")}},
		{name: "TestDetailedMetric (both)", files: []string{`
domain: nest
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: b
        detailed_metric: false
        rate_limit: {unit: minute, requests_per_unit: 5}
`}, loads: true, lookups: []lookup{lk("nest", w("nest.a.b", 5, minute), "a=1", "b=2")}},
		{name: "TestDetailedMetric (realistic)", files: []string{`
domain: nest
descriptors:
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: client
    value: known
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: app
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - key: call
        detailed_metric: true
      - key: call
        value: login
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: app
    value: vip
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 50000}
    descriptors:
      - key: call
        detailed_metric: true
      - key: call
        value: login
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
`}, loads: true, lookups: []lookup{
			lk("nest", w("nest.client", 500, minute), "client=other"),
			lk("nest", w("nest.app", 5000, minute), "app=mobile"),
			lk("nest", w("nest.app.call_login", 5, minute), "app=mobile", "call=login"),
		}},
		{name: "TestValueToMetric (runtime values, empty values, full key)", files: []string{chainConfig}, loads: true, lookups: []lookup{
			lk("chain", w("chain.route.verb.subject", 60, minute), "route=draw", "verb=GET", "subject=7"),
			lk("chain", w("chain.route.verb.subject", 60, minute), "route=", "verb=GET", "subject=7"),
			lk("chain", w("chain.route.verb.subject", 60, minute), "route=draw", "verb=", "subject=7"),
			lk("chain", w("chain.route.verb.subject", 60, minute), "route=", "verb=", "subject=7"),
			lk("chain", w("chain.route.verb.subject", 60, minute), "route=api", "verb=GET", "subject=u1"),
		}},
		{name: "TestValueToMetric_DefaultKeyIncludesValueAtThatLevel", files: []string{"domain: d\ndescriptors:\n  - key: k1\n    value_to_metric: true\n    descriptors:\n      - key: k2\n        rate_limit: {unit: second, requests_per_unit: 1}\n"}, loads: true, lookups: []lookup{
			lk("d", w("d.k1.k2", 1, second), "k1=A", "k2=B"),
		}},
		{name: "TestValueToMetric_MidLevelOnly", files: []string{"domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        value_to_metric: true\n        descriptors:\n          - key: k3\n            rate_limit: {unit: second, requests_per_unit: 1}\n"}, loads: true, lookups: []lookup{
			lk("d", w("d.k1.k2.k3", 1, second), "k1=A", "k2=B", "k3=C"),
		}},
		{name: "TestValueToMetric_NoFlag_Unchanged", files: []string{"domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        rate_limit: {unit: second, requests_per_unit: 1}\n"}, loads: true, lookups: []lookup{
			lk("d", w("d.k1.k2", 1, second), "k1=A", "k2=B"),
		}},
		{name: "TestValueToMetric_DoesNotOverrideDetailedMetric", files: []string{strings.Replace(chainConfig, "          - key: subject\n", "          - key: subject\n            detailed_metric: true\n", 1)}, loads: true, lookups: []lookup{
			lk("chain", w("chain.route.verb.subject", 60, minute), "route=draw", "verb=GET", "subject=7"),
		}},
		{name: "TestValueToMetric_WithConfiguredValues", files: []string{`
domain: chain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: verb
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: verb
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject
            rate_limit: {unit: minute, requests_per_unit: 30}
`}, loads: true, lookups: []lookup{
			lk("chain", w("chain.route.verb_GET.subject", 60, minute), "route=api", "verb=GET", "subject=u1"),
			lk("chain", w("chain.route.verb_POST.subject", 30, minute), "route=api", "verb=POST", "subject=u2"),
		}},
		{name: "TestValueToMetric_WithWildcard", files: []string{`
domain: chain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
`}, loads: true, lookups: []lookup{
			lk("chain", w("chain.user.action_read*.resource", 100, minute), "user=ann", "action=readfile", "resource=docs"),
			lk("chain", w("chain.user.action_read*.resource", 100, minute), "user=ben", "action=readrow", "resource=db"),
		}},
		{name: "TestValueToMetric_FullKeyMatchesStatsKey (no flags)", files: []string{strings.ReplaceAll(chainConfig, "value_to_metric: true", "value_to_metric: false")}, loads: true, lookups: []lookup{
			lk("chain", w("chain.route.verb.subject", 60, minute), "route=api", "verb=GET", "subject=u1"),
		}},
		{name: "TestValueToMetric_FullKeyMatchesStatsKey (detailed)", files: []string{"domain: d3\ndescriptors:\n  - key: route\n    descriptors:\n      - key: verb\n        descriptors:\n          - key: subject\n            detailed_metric: true\n            rate_limit: {unit: minute, requests_per_unit: 60}\n"}, loads: true, lookups: []lookup{
			lk("d3", w("d3.route.verb.subject", 60, minute), "route=api", "verb=GET", "subject=u1"),
		}},
		{name: "TestShareThreshold", files: []string{sharedConfig}, loads: true, lookups: []lookup{
			// One pattern for every value it matches.
			lk("store", shared(w("store.doc_docs/*", 100, minute), "docs/*"), "doc=docs/a.pdf"),
			lk("store", shared(w("store.doc_docs/*", 100, minute), "docs/*"), "doc=docs/b.csv"),
			lk("store", shared(w("store.doc_docs/*", 100, minute), "docs/*"), "doc=docs/c.txt"),
			// With metric flags beside it.
			lk("store", shared(w("store.api_v1/*.verb", 60, minute), "v1/*", ""), "api=v1/users", "verb=GET"),
			lk("store", shared(w("store.svc_svc/*.op", 80, minute), "svc/*", ""), "svc=svc/user", "op=get"),
			// Nested.
			lk("store", shared(w("store.team_red.doc_red/*", 200, minute), "", "red/*"), "team=red", "doc=red/one.txt"),
			lk("store", shared(w("store.doc_outer/*.doc_red/*", 300, minute), "outer/*", "red/*"), "doc=outer/one.txt", "doc=red/one.txt"),
			lk("store", shared(w("store.dir_dir/*.blob_blob/*.kind", 120, minute), "dir/*", "", ""), "dir=dir/x", "blob=blob/y", "kind=pdf"),
			lk("store", shared(w("store.member_m/*.item_i/*.verb", 150, minute), "m/*", "i/*", ""), "member=m/ann", "item=i/doc", "verb=read"),
			// A value beats a wildcard.
			lk("store", w("store.sheet_q1", 50, minute), "sheet=q1"),
			lk("store", shared(w("store.sheet_q*", 100, minute), "q*"), "sheet=q2"),
			lk("store", shared(w("store.sheet_q*", 100, minute), "q*"), "sheet=q23"),
			lk("store", shared(w("store.sheet_q*", 100, minute), "q*"), "sheet=q123"),
			// '*' in the middle, and several.
			lk("store", shared(w("store.mid_/v*x", 100, minute), "/v*x"), "mid=/v/x"),
			lk("store", shared(w("store.mid_/v*x", 100, minute), "/v*x"), "mid=/v-beta-x"),
			lk("store", shared(w("store.mid_/v*x", 100, minute), "/v*x"), "mid=/vQRSx"),
			lk("store", want{}, "mid=/v/y"),
			lk("store", shared(w("store.multi_a*b*c", 50, minute), "a*b*c"), "multi=aXbYc"),
			lk("store", shared(w("store.multi_a*b*c", 50, minute), "a*b*c"), "multi=aXXXbYYYc"),
			lk("store", shared(w("store.multi_a*b*c", 50, minute), "a*b*c"), "multi=abc"),
			lk("store", want{}, "multi=aXYc"),
			lk("store", shared(w("store.midmetric_/w*y", 80, minute), "/w*y"), "midmetric=/w/y"),
			lk("store", shared(w("store.midmetric_/w*y", 80, minute), "/w*y"), "midmetric=/w-beta-y"),
			lk("store", shared(w("store.org_o*live.item_i*2", 60, minute), "o*live", "i*2"), "org=o1live", "item=iA2"),
			lk("store", shared(w("store.org_o*live.item_i*2", 60, minute), "o*live", "i*2"), "org=o99live", "item=iBBB2"),
		}},
		{name: "TestWildcardStatsBehavior (no flags)", files: []string{"domain: w\ndescriptors:\n  - key: k\n    value: p*\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"}, loads: true, lookups: []lookup{
			lk("w", w("w.k_p*", 20, minute), "k=p1"),
		}},
		{name: "TestWildcardStatsBehavior (value_to_metric)", files: []string{"domain: w\ndescriptors:\n  - key: k\n    value: p*\n    value_to_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"}, loads: true, lookups: []lookup{
			lk("w", w("w.k_p*", 20, minute), "k=p1"),
		}},
		{name: "TestWildcardStatsBehavior (share_threshold)", files: []string{"domain: w\ndescriptors:\n  - key: k\n    value: p*\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"}, loads: true, lookups: []lookup{
			lk("w", shared(w("w.k_p*", 20, minute), "p*"), "k=p1"),
		}},
		{name: "TestWildcardStatsBehavior (share_threshold, value_to_metric)", files: []string{"domain: w\ndescriptors:\n  - key: k\n    value: p*\n    share_threshold: true\n    value_to_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"}, loads: true, lookups: []lookup{
			lk("w", shared(w("w.k_p*", 20, minute), "p*"), "k=p1"),
		}},
		{name: "TestWildcardStatsBehavior (value_to_metric below)", files: []string{"domain: w\ndescriptors:\n  - key: k\n    value: p*\n    descriptors:\n      - key: o\n        value_to_metric: true\n        descriptors:\n          - key: l\n            rate_limit: {unit: minute, requests_per_unit: 20}\n"}, loads: true, lookups: []lookup{
			lk("w", w("w.k_p*.o.l", 20, minute), "k=p1", "o=x", "l=y"),
		}},
		{name: "TestWildcardStatsBehavior (middle and trailing)", files: []string{"domain: w\ndescriptors:\n  - key: k\n    value: p*q*\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"}, loads: true, lookups: []lookup{
			lk("w", w("w.k_p*q*", 20, minute), "k=p12q34"),
			lk("w", w("w.k_p*q*", 20, minute), "k=pXqY"),
		}},
		{name: "TestWildcardStatsBehavior (middle and trailing, value_to_metric)", files: []string{"domain: w\ndescriptors:\n  - key: k\n    value: p*q*\n    value_to_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"}, loads: true, lookups: []lookup{
			lk("w", w("w.k_p*q*", 20, minute), "k=p12q34"),
		}},
		{name: "TestMetadata", files: []string{`
domain: shop
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          owner: billing
      - key: user
        value: admin
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: plan
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      quota_owner:
        owner: growth
`}, loads: true, lookups: []lookup{
			lk("shop", want{}),
			lk("shop", want{path: "shop.tenant_acme.user", rpu: 5, unit: second, metadata: `{"owner":"billing"}`}, "tenant=acme", "user=bob"),
			lk("shop", want{path: "shop.plan", rpu: 20, unit: minute, metadata: `{"quota_owner":{"owner":"growth"}}`}, "plan=free"),
		}},
	}
}

// compatLoad loads a case's files as drip serve loads them.
func compatLoad(c compatCase) (*Config, error) {
	files := make([]File, len(c.files))
	for i, f := range c.files {
		files[i] = File{Name: "f" + string(rune('1'+i)) + ".yaml", Data: []byte(f)}
	}
	return ParseWith(Options{MergeDomains: c.merge}, files...)
}

// TestUpstreamCompatibility runs the compatibility suite and reports how
// much of it agrees.
func TestUpstreamCompatibility(t *testing.T) {
	var files, filesOK, lookups, lookupsOK int
	for _, c := range compatCases() {
		files++
		cfg, err := compatLoad(c)
		switch {
		case c.loads && err != nil:
			t.Errorf("%s: not loaded: %v", c.name, err)
			lookups += len(c.lookups)
			continue
		case !c.loads && err == nil:
			t.Errorf("%s: loaded, want rejected", c.name)
			continue
		case !c.loads:
			if re := (*rules.Error)(nil); !errors.As(err, &re) {
				t.Errorf("%s: error %T, want *Error", c.name, err)
				continue
			}
		}
		filesOK++
		for _, l := range c.lookups {
			lookups++
			if msg := checkLookup(cfg, l); msg != "" {
				t.Errorf("%s: %s %s: %s", c.name, l.domain, strings.Join(l.entries, ","), msg)
				continue
			}
			lookupsOK++
		}
	}
	t.Logf("envoyproxy/ratelimit compatibility: %d of %d configurations loaded or rejected as upstream, %d of %d lookups agree", filesOK, files, lookupsOK, lookups)
}

// checkLookup returns what differs between a lookup's limit and the one
// wanted, or "".
func checkLookup(cfg *Config, l lookup) string {
	m := cfg.match(l.domain, entries(l.entries...))
	got, wt := m.limit, l.want
	switch {
	case got == nil && wt.path == "":
		return ""
	case got == nil:
		return "no limit, want " + wt.path
	case wt.path == "":
		return "matched " + got.Path + ", want no limit"
	}
	var diff []string
	check := func(ok bool, what string) {
		if !ok {
			diff = append(diff, what)
		}
	}
	check(got.Path == wt.path, "path "+got.Path+", want "+wt.path)
	check(got.RequestsPerUnit == wt.rpu, "requests_per_unit")
	check(got.Unit == wt.unit || wt.unlimited, "unit "+got.Unit.String())
	check(got.Name == wt.name, "name "+got.Name)
	check(got.Unlimited == wt.unlimited, "unlimited")
	check(got.Shadow == wt.shadow, "shadow_mode")
	check(got.Quota == wt.quota, "quota_mode")
	check(strings.Join(m.shared, "|") == strings.Join(wt.shared, "|"), "share_threshold patterns "+strings.Join(m.shared, "|"))
	meta := ""
	if got.Metadata != nil {
		b, _ := protojson.Marshal(got.Metadata)
		meta = strings.ReplaceAll(string(b), " ", "")
	}
	check(meta == wt.metadata, "metadata "+meta)
	return strings.Join(diff, "; ")
}

// TestUpstreamOverrides stands for upstream's TestConfigLimitOverride: a
// descriptor's own limit replaces the configured one in a known domain,
// and is ignored in an unknown domain. Upstream names its stats by the
// descriptor's path; drip names every such limit "<domain>.request_limit"
// (by design: values are the client's, and a name per value would grow the
// metrics without bound; TestOverrideNames).
func TestUpstreamOverrides(t *testing.T) {
	cfg, err := compatLoad(compatCases()[0])
	if err != nil {
		t.Fatal(err)
	}
	var heard []string
	svc := NewService(memstore.New(), cfg, engine.WithObserver(observerFunc(func(limit string, shadow bool, outcome string) {
		heard = append(heard, limit)
	})))
	for _, tc := range []struct {
		domain  string
		entries []string
		rpu     uint32
		unit    typev3.RateLimitUnit
		want    string // the path heard, "" for no limit
	}{
		{"elsewhere", []string{"tenant=acme"}, 10, typev3.RateLimitUnit_DAY, ""},
		{"shop", []string{"tenant=acme", "user=bob"}, 10, typev3.RateLimitUnit_DAY, "shop" + OverrideSuffix},
		{"shop", []string{"tenant=acme", "user=bob"}, 42, typev3.RateLimitUnit_HOUR, "shop" + OverrideSuffix},
		{"shop", []string{"tenant=acme", "user=carol"}, 42, typev3.RateLimitUnit_HOUR, "shop" + OverrideSuffix},
	} {
		heard = nil
		d := &ratelimitv3.RateLimitDescriptor{Entries: entries(tc.entries...), Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: tc.rpu, Unit: tc.unit}}
		resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: tc.domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		cur := resp.Statuses[0].CurrentLimit
		if tc.want == "" {
			if cur != nil || len(heard) > 0 {
				t.Errorf("%s: limit %v (%v), want none", tc.domain, cur, heard)
			}
			continue
		}
		if cur == nil || cur.RequestsPerUnit != tc.rpu || int32(cur.Unit) != int32(tc.unit) || len(heard) != 1 || heard[0] != tc.want {
			t.Errorf("%s %v: limit %v heard %v, want %d per %v at %s", tc.domain, tc.entries, cur, heard, tc.rpu, tc.unit, tc.want)
		}
	}
}
