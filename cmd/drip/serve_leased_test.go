package main

import (
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/testserver"
)

// TestServeLeased: with --leased, the decision API's takes are decided
// from blocks of the bucket's tokens, and a burst of 20 (refilling one a
// day) grants exactly 20 of 60 takes: none over, and one instance alone
// is never denied early (it gives its blocks back before it asks);
// /metrics counts them. On the memory store and on PostgreSQL.
func TestServeLeased(t *testing.T) {
	for _, st := range []struct {
		name string
		args func(t *testing.T) []string
	}{
		{"memory", func(*testing.T) []string { return nil }},
		{"postgres", func(t *testing.T) []string {
			u := testserver.SharedPostgres(t).URL()
			if strings.Contains(u, "?") {
				return []string{"--store", u + "&drip_install=true"}
			}
			return []string{"--store", u + "?drip_install=true"}
		}},
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
			for _, want := range []string{"drip_leased_decisions_total 60", `drip_leased_blocks_total{event="fetched"}`, "drip_leased_tokens_held"} {
				if !strings.Contains(metrics, want) {
					t.Errorf("/metrics lacks %q", want)
				}
			}
		})
	}
}
