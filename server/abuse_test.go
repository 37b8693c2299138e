package server

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/store/memstore"
)

// TestLongInlineKeys: an inline key over MaxInlineKeyLen is a 400 on
// every endpoint and every store, and takes nothing; a long key under it
// is a key like any other. (3,000 takes with 1 MB keys had grown the
// memory store to 5.15 GB and Redis by 503 MB.)
func TestLongInlineKeys(t *testing.T) {
	for _, st := range teststores.Shared() {
		t.Run(st.Name, func(t *testing.T) {
			srv := start(t, Config{}, st.Open(t))
			huge := strings.Repeat("k", maxBody/2) // half the body cap
			over := strings.Repeat("k", MaxInlineKeyLen+1)
			for _, body := range []string{
				`{"key": "` + huge + `", ` + lim + `}`,
				`{"key": "` + over + `", ` + lim + `}`,
			} {
				for _, op := range []string{"take", "peek", "refund"} {
					if code, resp := post(t, srv.base+"/v1/"+op, body); code != http.StatusBadRequest || !strings.Contains(resp, "key too long") {
						t.Errorf("/v1/%s with a %d-byte key: %d %s, want 400 key too long", op, len(body), code, resp)
					}
				}
			}
			if code, resp := post(t, srv.base+"/v1/reset", `{"key": "`+over+`"}`); code != http.StatusBadRequest {
				t.Errorf("/v1/reset with a key over the bound: %d %s, want 400", code, resp)
			}
			multi := fmt.Sprintf(`{"requests": [{"key": "a", %s}, {"key": "%s", %s}]}`, lim, over, lim)
			if code, resp := post(t, srv.base+"/v1/take", multi); code != http.StatusBadRequest || !strings.Contains(resp, "requests[1]") {
				t.Errorf("a multi-take with a key over the bound: %d %s, want 400 naming requests[1]", code, resp)
			}
			// Nothing was taken, and a long key under the bound (less
			// room for the shared test stores' own prefix) works.
			if _, resp := post(t, srv.base+"/v1/peek", `{"key": "a", "cost": 0, `+lim+`}`); decision(t, resp).Tokens != 3 {
				t.Errorf("after the refusals, a holds %s, want 3 tokens", resp)
			}
			long := strings.Repeat("k", MaxInlineKeyLen-64)
			for want := int64(2); want >= 1; want-- { // on the store's clock: remaining, not tokens
				code, resp := post(t, srv.base+"/v1/take", `{"key": "`+long+`", `+lim+`}`)
				if code != http.StatusOK || int64(decision(t, resp).Remaining) != want {
					t.Fatalf("take on a %d-byte key: %d %s, want %v remaining", len(long), code, resp, want)
				}
			}
		})
	}
}

// TestMaxRequests: a multi-take of more than replay.MaxRequests requests
// is a 400 and takes nothing (29,000-request multi-takes had cut a
// concurrent client on Redis from 10,500 to 42 requests/s); MaxRequests
// requests are fine.
func TestMaxRequests(t *testing.T) {
	srv := start(t, Config{}, memstore.New())
	body := func(n int) string {
		rs := make([]string, n)
		for i := range rs {
			rs[i] = fmt.Sprintf(`{"key": "m%d", %s}`, i, lim)
		}
		return `{"requests": [` + strings.Join(rs, ",") + `]}`
	}
	for _, op := range []string{"take", "peek"} {
		code, resp := post(t, srv.base+"/v1/"+op, body(replay.MaxRequests+1))
		if code != http.StatusBadRequest || !strings.Contains(resp, "at most 100") {
			t.Fatalf("/v1/%s of %d requests: %d %s, want 400", op, replay.MaxRequests+1, code, resp)
		}
	}
	if _, resp := post(t, srv.base+"/v1/peek", `{"key": "m0", "cost": 0, `+lim+`}`); decision(t, resp).Tokens != 3 {
		t.Fatalf("a refused multi-take took from m0: %s", resp)
	}
	if code, resp := post(t, srv.base+"/v1/take", body(replay.MaxRequests)); code != http.StatusOK || !strings.Contains(resp, `"allowed":true`) {
		t.Fatalf("a multi-take of %d requests: %d %s", replay.MaxRequests, code, resp)
	}
}

// TestRuleReservations: by rule, a reservation is allowed only up to the
// rule's max_reserved, and not at all without one. (One unauthenticated
// call reserving 1e12 tokens through the built-in per-ip rule had locked
// that IP out for 1e11 seconds.)
func TestRuleReservations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	writeFile(t, path, `{"rules": [
	  {"name": "per-ip", "limit_keys": ["ip:address"], "algorithm_config": {"rps": 10, "burst": 20}},
	  {"name": "jobs", "limit_keys": ["header:x-tenant"], "algorithm_config": {"rate": 1, "period": "1h", "burst": 2, "max_reserved": 3}}
	]}`)
	srv := start(t, Config{Rules: path, WatchEvery: -1}, memstore.New())
	for _, body := range []string{
		`{"rule": "per-ip", "values": ["203.0.113.5"], "cost": 1e12, "reserve": true}`,
		`{"rule": "per-ip", "values": ["203.0.113.5"], "cost": 1, "reserve": true}`,
		`{"requests": [{"rule": "per-ip", "values": ["203.0.113.5"], "cost": 1, "reserve": true}]}`,
	} {
		if code, resp := post(t, srv.base+"/v1/take", body); code != http.StatusBadRequest || !strings.Contains(resp, "allows no reservations") {
			t.Errorf("%s: %d %s, want 400", body, code, resp)
		}
	}
	if _, resp := post(t, srv.base+"/v1/peek", `{"rule": "per-ip", "values": ["203.0.113.5"], "cost": 0}`); decision(t, resp).Tokens != 20 {
		t.Errorf("after the refused reservations, per-ip holds %s, want 20 tokens", resp)
	}
	// Beyond burst + max_reserved it can never fit: an error or a denial,
	// and either way nothing is taken.
	if code, resp := post(t, srv.base+"/v1/take", `{"rule": "jobs", "values": ["t1"], "cost": 1e12, "reserve": true}`); code != http.StatusBadRequest && (code != http.StatusOK || decision(t, resp).Allowed) {
		t.Errorf("a reservation beyond max_reserved: %d %s, want 400 or a denial", code, resp)
	}
	if _, resp := post(t, srv.base+"/v1/peek", `{"rule": "jobs", "values": ["t1"], "cost": 0}`); decision(t, resp).Tokens != 2 {
		t.Errorf("after a reservation beyond max_reserved, jobs holds %s, want 2 tokens", resp)
	}
	code, resp := post(t, srv.base+"/v1/take", `{"rule": "jobs", "values": ["t1"], "cost": 5, "reserve": true}`)
	if d := decision(t, resp); code != http.StatusOK || !d.Allowed || d.Tokens != -3 {
		t.Errorf("a reservation within max_reserved: %d %s, want allowed with 3 tokens of debt", code, resp)
	}
	code, resp = post(t, srv.base+"/v1/take", `{"rule": "jobs", "values": ["t1"], "cost": 1, "reserve": true}`)
	if d := decision(t, resp); code != http.StatusOK || d.Allowed {
		t.Errorf("a reservation past max_reserved's debt: %d %s, want denied", code, resp)
	}
}

// TestDeepBodies: a body nested as deep as the body cap allows is a 400
// naming the nesting (the strict check once walked it one stack frame
// per level: 128 MB of stack for a body of "[[[...").
func TestDeepBodies(t *testing.T) {
	srv := start(t, Config{}, memstore.New())
	for _, body := range []string{
		strings.Repeat("[", maxBody),
		`{"requests": ` + strings.Repeat(`[{"key": `, maxBody/10),
		`{"rule": "per-ip", "values": ` + strings.Repeat(`{"a": `, maxBody/7),
	} {
		if code, resp := post(t, srv.base+"/v1/take", body); code != http.StatusBadRequest || !strings.Contains(resp, "nested more than") {
			t.Errorf("a %d-byte body nested deep: %d %.200s, want 400 about nesting", len(body), code, resp)
		}
	}
}
