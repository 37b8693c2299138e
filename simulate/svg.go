package simulate

import (
	"bufio"
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/driplimit/drip"
)

// The chart's geometry, in SVG user units (pixels).
const (
	chartW     = 960
	chartH     = 560
	plotLeft   = 76
	plotRight  = chartW - 90
	tokensTop  = 56
	tokensBot  = 256
	ratesTop   = 304
	ratesBot   = 496
	colTokens  = "#1f77b4"
	colFill    = "#1f77b433"
	colAccept  = "#2ca02c"
	colDeny    = "#d62728"
	colGuide   = "#555555"
	colGrid    = "#e5e5e5"
	fontFamily = "system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif"
)

// WriteSVG draws the run as an SVG image: above, the tokens in the chart
// key's bucket over time, with the burst marked; below, the requests per
// second accepted and denied (stacked bars), with the limit's rate marked.
// Both panels share the time axis; every axis is labelled. title heads the
// chart. It uses the standard library only.
func (r *Report) WriteSVG(w io.Writer, title string) error {
	b := bufio.NewWriter(w)
	end := r.End.Seconds()
	xOf := func(t float64) float64 { return plotLeft + (plotRight-plotLeft)*t/end }

	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s" font-size="12">`+"\n",
		chartW, chartH, chartW, chartH, fontFamily)
	fmt.Fprintf(b, "<title>%s</title>\n", esc(title))
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="white"/>`+"\n", chartW, chartH)
	fmt.Fprintf(b, `<text x="%d" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", plotLeft, esc(title))

	// Tokens panel.
	burst := r.Limit.Burst
	if burst == 0 {
		burst = r.Limit.Rate
	}
	lo, hi := 0.0, burst
	for _, s := range r.Tokens {
		lo, hi = math.Min(lo, s.Tokens), math.Max(hi, s.Tokens)
	}
	tokY := scale(lo, hi*1.08, tokensBot, tokensTop)
	tokenLabel := "tokens in bucket"
	if r.Keys > 1 {
		tokenLabel = "tokens (" + r.ChartKey + ")"
	}
	axes(b, xOf, end, tokY, lo, hi*1.08, tokensTop, tokensBot, tokenLabel, false)
	if len(r.Tokens) > 0 {
		var path strings.Builder
		step := r.Limit.Algorithm == drip.FixedWindow || r.Limit.Refill == drip.Interval
		for i, s := range r.Tokens {
			x, y := xOf(s.At.Seconds()), tokY(s.Tokens)
			switch {
			case i == 0:
				fmt.Fprintf(&path, "M%s %s", num(x), num(y))
			case step:
				fmt.Fprintf(&path, "H%sV%s", num(x), num(y))
			default:
				fmt.Fprintf(&path, "L%s %s", num(x), num(y))
			}
		}
		last := r.Tokens[len(r.Tokens)-1]
		if last.At < r.End {
			fmt.Fprintf(&path, "H%s", num(xOf(end)))
		}
		fmt.Fprintf(b, `<path d="%sV%sH%sZ" fill="%s" stroke="none"/>`+"\n", path.String(), num(tokY(0)), num(xOf(r.Tokens[0].At.Seconds())), colFill)
		fmt.Fprintf(b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.5" stroke-linejoin="round"/>`+"\n", path.String(), colTokens)
	}
	guide(b, xOf(end), tokY(burst), "burst "+strconv.FormatFloat(burst, 'g', -1, 64))
	legend(b, tokensTop-8, []legendItem{{colTokens, "line", "tokens"}, {colGuide, "dash", "burst (capacity)"}})

	// Rates panel.
	rateLimit := r.Limit.Rate / periodOf(r.Limit).Seconds()
	top := rateLimit
	for _, bar := range r.Bars {
		top = math.Max(top, float64(bar.Sent)/(bar.To-bar.From).Seconds())
	}
	top *= 1.1
	rateY := scale(0, top, ratesBot, ratesTop)
	axes(b, xOf, end, rateY, 0, top, ratesTop, ratesBot, "requests per second", true)
	for _, bar := range r.Bars {
		from, to := bar.From.Seconds(), math.Min(bar.To.Seconds(), end)
		if bar.Sent == 0 || from >= end {
			continue
		}
		width := (bar.To - bar.From).Seconds()
		x0, x1 := xOf(from), xOf(to)
		gap := math.Min(1, (x1-x0)/5)
		acc := float64(bar.Accepted) / width
		all := float64(bar.Sent) / width
		rect(b, x0+gap, rateY(acc), x1-x0-2*gap, rateY(0)-rateY(acc), colAccept)
		rect(b, x0+gap, rateY(all), x1-x0-2*gap, rateY(acc)-rateY(all), colDeny)
	}
	guide(b, xOf(end), rateY(rateLimit), "rate "+strconv.FormatFloat(rateLimit, 'g', 4, 64)+"/s")
	rateKey := "limit rate"
	if r.Keys > 1 {
		rateKey = "limit rate (of each key; the bars count all keys)"
	}
	legend(b, ratesTop-8, []legendItem{{colAccept, "box", "accepted"}, {colDeny, "box", "denied"}, {colGuide, "dash", rateKey}})

	fmt.Fprintf(b, `<text x="%s" y="%d" text-anchor="middle">time (s)</text>`+"\n", num((plotLeft+plotRight)/2.0), ratesBot+44)
	fmt.Fprintln(b, "</svg>")
	return b.Flush()
}

// scale maps [lo, hi] to [y0, y1].
func scale(lo, hi, y0, y1 float64) func(float64) float64 {
	if hi <= lo {
		hi = lo + 1
	}
	return func(v float64) float64 { return y0 + (y1-y0)*(v-lo)/(hi-lo) }
}

// axes draws a panel's frame, grid, ticks and the y axis' label; the time
// ticks are labelled when xLabels is set.
func axes(b *bufio.Writer, xOf func(float64) float64, end float64, yOf func(float64) float64, lo, hi, top, bot float64, label string, xLabels bool) {
	for _, v := range ticks(lo, hi, 6) {
		y := yOf(v)
		fmt.Fprintf(b, `<line x1="%d" y1="%s" x2="%d" y2="%s" stroke="%s"/>`+"\n", plotLeft, num(y), plotRight, num(y), colGrid)
		fmt.Fprintf(b, `<text x="%d" y="%s" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", plotLeft-6, num(y), tickLabel(v, hi-lo))
	}
	for _, t := range ticks(0, end, 10) {
		x := xOf(t)
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>`+"\n", num(x), num(top), num(x), num(bot), colGrid)
		if xLabels {
			fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", num(x), num(bot+18), tickLabel(t, end))
		}
	}
	fmt.Fprintf(b, `<path d="M%d %sV%sH%d" fill="none" stroke="black"/>`+"\n", plotLeft, num(top), num(bot), plotRight)
	mid := (top + bot) / 2
	fmt.Fprintf(b, `<text x="20" y="%s" text-anchor="middle" transform="rotate(-90 20 %s)">%s</text>`+"\n", num(mid), num(mid), esc(label))
}

// guide draws a dashed horizontal line at y across the plot, labelled in
// the margin at its right end.
func guide(b *bufio.Writer, xEnd, y float64, label string) {
	fmt.Fprintf(b, `<line x1="%d" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-dasharray="6 4"/>`+"\n", plotLeft, num(y), num(xEnd), num(y), colGuide)
	fmt.Fprintf(b, `<text x="%s" y="%s" dominant-baseline="middle" fill="%s">%s</text>`+"\n", num(xEnd+6), num(y), colGuide, esc(label))
}

type legendItem struct{ color, kind, label string }

// legend writes a row of keys above a panel, from its left edge.
func legend(b *bufio.Writer, y float64, items []legendItem) {
	x := float64(plotLeft)
	for _, it := range items {
		switch it.kind {
		case "box":
			rect(b, x, y-9, 12, 10, it.color)
		case "dash":
			fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-dasharray="6 4"/>`+"\n", num(x), num(y-4), num(x+16), num(y-4), it.color)
		default:
			fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"/>`+"\n", num(x), num(y-4), num(x+16), num(y-4), it.color)
		}
		fmt.Fprintf(b, `<text x="%s" y="%s">%s</text>`+"\n", num(x+20), num(y), esc(it.label))
		x += 20 + 7.5*float64(len(it.label)) + 18
	}
}

func rect(b *bufio.Writer, x, y, w, h float64, color string) {
	if w <= 0 || h <= 0 {
		return
	}
	fmt.Fprintf(b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n", num(x), num(y), num(w), num(h), color)
}

// ticks returns round values (1, 2 or 5 times a power of ten apart) from
// lo to hi, about n of them.
func ticks(lo, hi float64, n int) []float64 {
	if !(hi > lo) {
		return []float64{lo}
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var vs []float64
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		vs = append(vs, math.Round(v/step)*step)
	}
	return vs
}

// tickLabel writes v with as many decimals as a range of span needs.
func tickLabel(v, span float64) string {
	d := 0
	if span > 0 && span < 10 {
		d = int(math.Ceil(-math.Log10(span / 10)))
	}
	return strconv.FormatFloat(v, 'f', d, 64)
}

func num(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }

func esc(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
