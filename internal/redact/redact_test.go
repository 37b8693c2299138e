package redact

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"memory", "memory"},
		{"postgres://postgres:s3cret@db:5432/app?sslmode=disable", "postgres://postgres:xxxxx@db:5432/app?sslmode=disable"},
		{"postgres://db/app?password=s3cret&sslmode=require", "postgres://db/app?password=xxxxx&sslmode=require"},
		{"postgres://db/app?sslpassword=s3cret", "postgres://db/app?sslpassword=xxxxx"},
		{"redis://:s3cret@localhost:6379/0", "redis://:xxxxx@localhost:6379/0"},
		{"rediss://default:s3cret@h:6380?addr=h2:6380", "rediss://default:xxxxx@h:6380?addr=h2:6380"},
		{"redis://user@localhost:6379", "redis://user@localhost:6379"},
		{"postgres://u:s3cret@db/app?%zz", "postgres://u:xxxxx@db/app?%zz"}, // does not parse: Text
		{"host=db user=u password=s3cret dbname=app", "host=db user=u password=xxxxx dbname=app"},
		{"host=db password='s3cret and more' dbname=app", "host=db password=xxxxx dbname=app"},
		{"redis://:p@s3cret@h:6379", "redis://:xxxxx@h:6379"},
		{"redis://:s3cr/et@h:6379", "redis://:xxxxx@h:6379"}, // does not parse: Text
		{"redis+sentinel://u:s3cret@s1:26379,s2:26379/mymaster", "redis+sentinel://u:xxxxx@s1:26379,s2:26379/mymaster"},
		{"redis://h:6379?sentinel_password=s3cret&client_secret=s3cret&access_token=s3cret&auth=s3cret", "redis://h:6379?access_token=xxxxx&auth=xxxxx&client_secret=xxxxx&sentinel_password=xxxxx"},
	} {
		got := URL(c.in)
		if got != c.want {
			t.Errorf("URL(%q) = %q, want %q", c.in, got, c.want)
		}
		if strings.Contains(got, "s3cret") {
			t.Errorf("URL(%q) shows the secret: %q", c.in, got)
		}
	}
}

func TestText(t *testing.T) {
	//lint:ignore SA1007 the URL is invalid on purpose: url.Parse's error quotes it whole
	_, perr := url.Parse("postgres://postgres:s3cret@db:5432/app?x=%zz\x7f")
	for _, in := range []string{
		`pgstore: bad URL: parse "postgres://postgres:s3cret@db:5432/app": invalid port`,
		"dial redis://default:s3cret@10.0.0.1:6379 failed; postgres://u:s3cret@h/db?password=s3cret",
		"cannot parse `host=h password=s3cret`: failed",
		fmt.Sprint(perr),
	} {
		if got := Text(in); strings.Contains(got, "s3cret") || !strings.Contains(got, Mask) {
			t.Errorf("Text(%q) = %q", in, got)
		}
	}
	if got := Text("no secret in redis://localhost:6379 here"); got != "no secret in redis://localhost:6379 here" {
		t.Errorf("Text changed a clean message: %q", got)
	}
}

func TestError(t *testing.T) {
	base := errors.New("dial postgres://u:s3cret@h/db: refused")
	err := Error(fmt.Errorf("open: %w", base))
	if strings.Contains(err.Error(), "s3cret") || !errors.Is(err, base) {
		t.Errorf("Error: %q, Is %v", err, errors.Is(err, base))
	}
	clean := errors.New("clean")
	if Error(clean) != clean || Error(nil) != nil {
		t.Error("Error must return a clean error as it is")
	}
}
