package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/testkit/testserver"
)

// TestServeLeased: with --leased, the decision API's takes are decided
// from blocks of the bucket's tokens, and a burst of 20 (refilling one a
// day) grants exactly 20 of 60 takes: none over, and one instance alone
// is never denied early (it gives its blocks back before it asks);
// /metrics counts them. On PostgreSQL; on the memory store, which is in
// the process, --leased leases nothing (leasing would save no store call
// and cost the blocks' bookkeeping on every take): the takes are decided
// as without it, exactly, and /metrics counts no leased decision.
func TestServeLeased(t *testing.T) {
	for _, st := range []struct {
		name   string
		args   func(t *testing.T) []string
		leased bool
	}{
		{"memory", func(*testing.T) []string { return nil }, false},
		{"postgres", postgresStoreArgs, true},
	} {
		t.Run(st.name, func(t *testing.T) {
			args := append([]string{"--leased", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, st.args(t)...)
			api, admin, _ := serveInProcess(t, args...)
			key := testserver.Prefix() + "k" // apart from other runs on a shared server
			granted := 0
			for range 60 {
				code, body := httpDo(t, "POST", "http://"+api+"/v1/take", `{"key":"`+key+`","limit":{"rate":1,"period":"24h","burst":20}}`)
				if code != 200 {
					t.Fatalf("%d %s", code, body)
				}
				if strings.Contains(body, `"allowed":true`) {
					granted++
				}
			}
			if granted != 20 {
				t.Errorf("granted %d of 60 takes on a burst of 20, want exactly 20", granted)
			}
			_, metrics := httpDo(t, "GET", "http://"+admin+"/metrics", "")
			for _, want := range []string{"drip_leased_decisions_total ", `drip_leased_blocks_total{event="fetched"}`, "drip_leased_tokens_held"} {
				if got := strings.Contains(metrics, want); got != st.leased {
					t.Errorf("/metrics has %q: %v, want %v", want, got, st.leased)
				}
			}
		})
	}
}

// postgresStoreArgs is --store for the shared PostgreSQL server, with
// drip's schema installed.
func postgresStoreArgs(t *testing.T) []string {
	u := testserver.SharedPostgres(t).URL()
	if strings.Contains(u, "?") {
		return []string{"--store", u + "&drip_install=true"}
	}
	return []string{"--store", u + "?drip_install=true"}
}

// TestServeLeasedRule: without --leased, drip serve on Redis and on
// PostgreSQL leases the rules marked "leased": true and only them: the
// plain rule grants exactly its burst and takes no block, the leased one
// never more than its burst, and /metrics counts the leased rule's blocks
// under its name (takes come 16 at once, so that the leased rule's demand
// calls for blocks however slow the machine).
//
// A reload that renames the leased rule takes the old name's series off
// /metrics: rules that come and go do not pile up.
func TestServeLeasedRule(t *testing.T) {
	for name, store := range map[string]func(*testing.T) []string{
		"redis":    func(t *testing.T) []string { return []string{"--store", testserver.SharedRedisURL(t)} },
		"postgres": postgresStoreArgs,
	} {
		t.Run(name, func(t *testing.T) { serveLeasedRule(t, store(t)) })
	}
}

// leasedRulesFile is TestServeLeasedRule's rules, its leased rule named
// hot.
func leasedRulesFile(hot string) []byte {
	return []byte(`{"rules": [
		{"name": "` + hot + `", "limit_keys": ["header:x-tenant"], "match": {"path": "/hot"}, "leased": true,
		 "algorithm_config": {"rate": 1, "period": "24h", "burst": 100}},
		{"name": "cold", "limit_keys": ["header:x-tenant"], "match": {"path": "/cold"},
		 "algorithm_config": {"rate": 1, "period": "24h", "burst": 100}}]}`)
}

// serveLeasedRule is TestServeLeasedRule on the store args give.
func serveLeasedRule(t *testing.T, args []string) {
	file := filepath.Join(t.TempDir(), "rules.json")
	if err := os.WriteFile(file, leasedRulesFile("hot"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DRIP_ADMIN_TOKEN", "tok")
	api, admin, _ := serveInProcess(t, append(args, "--rules", file, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")...)
	tenant := testserver.Prefix() + "t"
	// burst sends 16 takes of rule's value at once and counts the granted.
	burst := func(rule, value string) int {
		var granted atomic.Int64
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				code, body := httpDo(t, "POST", "http://"+api+"/v1/take", `{"rule": "`+rule+`", "values": [`+strconv.Quote(value)+`]}`)
				if code != 200 {
					t.Errorf("%s: %d %s", rule, code, body)
				}
				if strings.Contains(body, `"allowed":true`) {
					granted.Add(1)
				}
			})
		}
		wg.Wait()
		return int(granted.Load())
	}
	granted := map[string]int{}
	for _, rule := range []string{"hot", "cold"} {
		for range 10 {
			granted[rule] += burst(rule, tenant)
		}
	}
	if granted["cold"] != 100 || granted["hot"] > 100 {
		t.Errorf("granted of 160: hot %d, cold %d; want at most 100 and exactly 100", granted["hot"], granted["cold"])
	}
	_, metrics := httpDo(t, "GET", "http://"+admin+"/metrics", "")
	if !strings.Contains(metrics, `drip_leased_rule_blocks_total{event="fetched",rule="hot"}`) {
		t.Errorf("/metrics lacks the leased rule's blocks fetched:\n%s", grepLines(metrics, "drip_leased"))
	}
	if strings.Contains(grepLines(metrics, "drip_leased_rule"), `rule="cold"`) {
		t.Errorf("/metrics counts blocks of the plain rule:\n%s", grepLines(metrics, "drip_leased"))
	}
	if !strings.Contains(metrics, "drip_leased_decisions_total ") {
		t.Errorf("/metrics lacks drip_leased_decisions_total")
	}

	// The leased rule renamed: hot's series go, hot2's come.
	if err := os.WriteFile(file+".tmp", leasedRulesFile("hot2"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", "http://"+admin+"/v1/admin/reload", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("admin reload: %d", resp.StatusCode)
	}
	// Bursts of takes until the instance leases a block of hot2's (a key
	// is leased once it proves hot: several takes within a short while).
	// Each burst is on a key of its own: on a busy machine a key may not
	// prove hot before its bucket is empty, and an empty bucket's takes
	// go to the store as probes, not blocks, so it would never show.
	for i := range 50 {
		burst("hot2", tenant+"2-"+strconv.Itoa(i))
		if _, metrics = httpDo(t, "GET", "http://"+admin+"/metrics", ""); strings.Contains(metrics, `rule="hot2"`) {
			break
		}
	}
	if got := grepLines(metrics, "drip_leased_rule"); strings.Contains(got, `rule="hot"`) || !strings.Contains(got, `rule="hot2"`) {
		t.Errorf("/metrics after hot was renamed hot2 (hot's series must go, hot2's come):\n%s", got)
	}
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestServeLeasedSaysSo: drip serve's first line says when --leased
// leases every limit, so that instances meant to share a store can be
// told apart at a glance when one was started without it; on the memory
// store, which is in the process, it says --leased leases nothing.
func TestServeLeasedSaysSo(t *testing.T) {
	for _, st := range []struct {
		name string
		args func(t *testing.T) []string
		says string // with --leased
	}{
		{"memory", func(*testing.T) []string { return nil }, "nothing leased"},
		{"postgres", postgresStoreArgs, "every limit leased"},
	} {
		for _, leasedFlag := range []bool{false, true} {
			args := append([]string{"serve", "--drain=0", "--listen", "127.0.0.1:0", "--admin-listen", "off"}, st.args(t)...)
			if leasedFlag {
				args = append(args, "--leased")
			}
			line := bannerOf(t, args)
			for _, says := range []string{"every limit leased", "nothing leased"} {
				want := leasedFlag && says == st.says
				if got := strings.Contains(line, says); got != want {
					t.Errorf("%s, --leased %v: the banner %q says %q: %v, want %v", st.name, leasedFlag, line, says, got, want)
				}
			}
		}
	}
}

// bannerOf runs drip with args until it prints its banner, and returns
// the banner's first line.
func bannerOf(t *testing.T, args []string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errs lockedBuffer
	code := make(chan int, 1)
	go func() { code <- run(ctx, args, strings.NewReader(""), &out, &errs) }()
	deadline := time.Now().Add(time.Minute) // generous: how fast is not tested
	for !strings.Contains(out.String(), "decision API on") {
		if time.Now().After(deadline) {
			cancel()
			<-code
			t.Fatalf("%v: no banner; stderr %s", args, errs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-code
	line, _, _ := strings.Cut(out.String(), "\n")
	return line
}
