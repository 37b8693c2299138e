package simulate

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/driplimit/drip"
)

// svgDoc is what the tests read back from a chart.
type svgDoc struct {
	root  string
	texts []string
	rects map[string]int // by fill
	paths []string
}

// parseSVG decodes a whole SVG document with encoding/xml, failing on any
// malformed token.
func parseSVG(t *testing.T, b []byte) svgDoc {
	t.Helper()
	doc := svgDoc{rects: map[string]int{}}
	dec := xml.NewDecoder(bytes.NewReader(b))
	dec.Strict = true
	depth := 0
	var inText bool
	var text strings.Builder
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				doc.root = tok.Name.Space + " " + tok.Name.Local
			}
			depth++
			attr := func(name string) string {
				for _, a := range tok.Attr {
					if a.Name.Local == name {
						return a.Value
					}
				}
				return ""
			}
			for _, a := range tok.Attr {
				if strings.Contains(a.Value, "NaN") || strings.Contains(a.Value, "Inf") {
					t.Errorf("<%s %s=%q>", tok.Name.Local, a.Name.Local, a.Value)
				}
			}
			switch tok.Name.Local {
			case "text":
				inText = true
				text.Reset()
			case "rect":
				doc.rects[attr("fill")]++
			case "path":
				doc.paths = append(doc.paths, attr("d"))
			}
		case xml.CharData:
			if inText {
				text.Write(tok)
			}
		case xml.EndElement:
			depth--
			if tok.Name.Local == "text" {
				inText = false
				doc.texts = append(doc.texts, text.String())
			}
		}
	}
	if depth != 0 {
		t.Fatalf("unbalanced elements: depth %d at the end", depth)
	}
	return doc
}

func TestSVG(t *testing.T) {
	res := run(t, "60/s for 10s, idle 5s, 60/s for 1s", burst50, Arrival{Cost: 1}, 0)
	var b bytes.Buffer
	if err := res.WriteSVG(&b, `drip simulate: 10/1s burst 50 & "60/s" <test>`); err != nil {
		t.Fatal(err)
	}
	doc := parseSVG(t, b.Bytes())
	if doc.root != "http://www.w3.org/2000/svg svg" {
		t.Errorf("root element %q, want svg in the SVG namespace", doc.root)
	}
	has := func(s string) bool {
		for _, x := range doc.texts {
			if x == s {
				return true
			}
		}
		return false
	}
	// The axes are labelled, the guides named, the title escaped.
	for _, want := range []string{"time (s)", "tokens in bucket", "requests per second", "burst 50", "rate 10/s",
		"accepted", "denied", `drip simulate: 10/1s burst 50 & "60/s" <test>`} {
		if !has(want) {
			t.Errorf("no text %q in %q", want, doc.texts)
		}
	}
	// Time ticks 0 to 16 every 2 s; token ticks 0 to 50 every 10.
	for _, v := range []int{0, 2, 8, 16, 10, 20, 50} {
		if !has(strconv.Itoa(v)) {
			t.Errorf("no tick label %d in %q", v, doc.texts)
		}
	}
	// Bars: accepted in every busy column (11 s of traffic, 0.5 s
	// columns), denied in most; the tokens drawn as a filled line.
	if doc.rects[colAccept] < 22 || doc.rects[colDeny] < 15 {
		t.Errorf("bars: %d accepted, %d denied", doc.rects[colAccept], doc.rects[colDeny])
	}
	tokens := 0
	for _, p := range doc.paths {
		if strings.Count(p, "L") > 100 {
			tokens++
		}
	}
	if tokens != 2 {
		t.Errorf("%d token paths (line and fill), want 2", tokens)
	}
}

func TestSVGEdgeCases(t *testing.T) {
	// No requests at all, a fixed window, reservations in debt: the chart
	// is still well-formed and free of NaN.
	for _, c := range []struct {
		pattern string
		limit   drip.Limit
		tmpl    Arrival
	}{
		{"idle 3s", burst50, Arrival{Cost: 1}},
		{"100 at once", drip.Limit{Algorithm: drip.FixedWindow, Rate: 5}, Arrival{Cost: 1}},
		{"30/s for 2s", drip.PerSecond(2), Arrival{Cost: 1.5, Reserve: true}},
	} {
		res := run(t, c.pattern, c.limit, c.tmpl, 0)
		var b bytes.Buffer
		if err := res.WriteSVG(&b, c.pattern); err != nil {
			t.Fatal(err)
		}
		parseSVG(t, b.Bytes())
	}
}
