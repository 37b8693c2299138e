package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/bucket"
)

// leaky is a store whose errors quote its URL with the password, as a
// driver's connection error may.
type leaky struct{ failing }

var errLeaky = errors.New("connect postgres://drip:s3cret@db:5432/app?password=s3cret: refused")

func (leaky) Apply(context.Context, bucket.Op, time.Time, []bucket.Prepared, []bucket.Result) error {
	return errLeaky
}

// TestNoSecretInAnswers: a store error that quotes a password reaches
// neither the decision API's answer nor /readyz.
func TestNoSecretInAnswers(t *testing.T) {
	srv := start(t, Config{}, leaky{})
	code, out := post(t, srv.base+"/v1/take", `{"key": "k", `+lim+`}`)
	if code != http.StatusServiceUnavailable || strings.Contains(out, "s3cret") || !strings.Contains(out, "drip:xxxxx@db") {
		t.Errorf("/v1/take: %d %s", code, out)
	}
	code, out = call(t, "GET", srv.admin+"/readyz", "")
	if code != http.StatusServiceUnavailable || strings.Contains(out, "s3cret") || !strings.Contains(out, "drip:xxxxx@db") {
		t.Errorf("/readyz: %d %s", code, out)
	}
}
