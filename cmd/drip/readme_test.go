package main

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/driplimit/drip/rules"
)

// TestDocumentedRequests runs every curl command of README.md,
// CONTRIBUTING.md and docs/*.md against drip serve --rules
// examples/rules.json (the file the documents tell a newcomer to start
// with), one fresh server per document that has any: each must answer
// 200, and where the document shows the answer on the next line, exactly
// that.
func TestDocumentedRequests(t *testing.T) {
	total := 0
	for _, doc := range docFiles(t) {
		cmds := documentedCurls(t, "../../"+doc)
		if len(cmds) == 0 {
			continue
		}
		total += len(cmds)
		t.Run(doc, func(t *testing.T) {
			t.Setenv("DRIP_LISTEN", "127.0.0.1:0")
			t.Setenv("DRIP_ADMIN_LISTEN", "127.0.0.1:0")
			api, admin, _ := serveInProcess(t, "--rules", "../../examples/rules.json", "--admin-token", "T")
			for _, c := range cmds {
				req, err := c.request(api, admin)
				if err != nil {
					t.Errorf("%s: %v", c.line, err)
					continue
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatalf("%s: %v", c.line, err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				got := strings.TrimSpace(string(b))
				if resp.StatusCode != http.StatusOK {
					t.Errorf("%s\n  answered %d %s", c.line, resp.StatusCode, got)
				} else if c.want != "" && got != c.want {
					t.Errorf("%s\n  answered %s\n  the document shows %s", c.line, got, c.want)
				}
			}
		})
	}
	if total < 20 {
		t.Errorf("only %d curl commands found in the documents, which hold more", total)
	}
}

// curlCmd is one documented curl command and the answer shown after it.
type curlCmd struct {
	line, want string
	args       []string
}

// documentedCurls reads the curl commands of the sh code blocks of a
// Markdown file.
func documentedCurls(t *testing.T, path string) []curlCmd {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cmds []curlCmd
	inSh := false
	afterCurl := false // the line before was a curl command: an answer may follow
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "```"):
			inSh = line == "```sh"
		case inSh && strings.HasPrefix(line, "curl "):
			cmds = append(cmds, curlCmd{line: line, args: shellWords(line)[1:]})
			afterCurl = true
			continue
		case inSh && afterCurl && strings.HasPrefix(line, "{"):
			cmds[len(cmds)-1].want = line
		}
		afterCurl = false
	}
	return cmds
}

// shellWords splits a command line as sh would for the documented
// commands: words, 'single-quoted' strings, and a # comment.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for _, r := range s {
		switch {
		case quoted && r == '\'':
			quoted = false
		case quoted:
			w.WriteRune(r)
		case r == '\'':
			quoted, inWord = true, true
		case r == '#' && !inWord:
			return words
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// request builds the HTTP request of a curl command, with the documented
// localhost:8080 and :9090 moved to the test server's addresses.
func (c curlCmd) request(api, admin string) (*http.Request, error) {
	method, url, body := "", "", ""
	hdr := http.Header{}
	for i := 0; i < len(c.args); i++ {
		switch a := c.args[i]; a {
		case "-s":
		case "-H":
			i++
			k, v, _ := strings.Cut(c.args[i], ":")
			hdr.Add(k, strings.TrimSpace(v))
		case "-X":
			i++
			method = c.args[i]
		case "-d":
			i++
			body = c.args[i]
		default:
			url = a
		}
	}
	url = strings.Replace(url, "localhost:8080", api, 1)
	url = strings.Replace(url, "localhost:9090", admin, 1)
	if method == "" {
		method = "GET"
		if body != "" {
			method = "POST"
		}
	}
	req, err := http.NewRequest(method, "http://"+url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = hdr
	return req, nil
}

// TestDocumentedRulesFile: the rules file that docs/rules.md shows is
// examples/rules.json, and its YAML block loads.
func TestDocumentedRulesFile(t *testing.T) {
	doc, err := os.ReadFile("../../docs/rules.md")
	if err != nil {
		t.Fatal(err)
	}
	block := func(lang string) string {
		_, after, ok := strings.Cut(string(doc), "```"+lang+"\n")
		if !ok {
			t.Fatalf("docs/rules.md has no %s block", lang)
		}
		b, _, _ := strings.Cut(after, "```")
		return b
	}
	shown, err := rules.Parse([]byte(block("json")), "shown.json")
	if err != nil {
		t.Fatalf("the JSON of docs/rules.md: %v", err)
	}
	shipped, err := rules.Load("../../examples/rules.json")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(shown.Rules, shipped.Rules) {
		t.Errorf("docs/rules.md shows other rules than examples/rules.json:\n%+v\n%+v", shown.Rules, shipped.Rules)
	}
	if _, err := rules.Parse([]byte(block("yaml")), "shown.yaml"); err != nil {
		t.Errorf("the YAML of docs/rules.md: %v", err)
	}
}
