package main

import (
	"fmt"
	"strings"
)

var policyColors = map[string]string{
	"gie-local": "#7f7f7f", "round-robin": "#4878a8", "least-load": "#6aa84f", "fleetinfer": "#d0703c", "oracle": "#8e63b5",
}

func svgHeader(b *strings.Builder, w, h int, title string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", w, h)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="white"/><text x="10" y="20" font-size="14">%s</text>`+"\n", w, h, title)
}

func svgLegend(b *strings.Builder, x, y int) {
	for i, p := range policies {
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			x+i*120, y-9, policyColors[p], x+i*120+14, y, p)
	}
}

// ttftSVG draws one panel per scenario with each policy's p99 TTFT (light
// bar) and p50 (solid bar), each panel on its own scale.
func (r *results) ttftSVG() string {
	const panelW, h, top, bottom, left = 250, 330, 60, 40, 50
	w := left + panelW*max(len(r.Scenarios), 1)
	var b strings.Builder
	svgHeader(&b, w, h, "TTFT per policy, ms: p99 (light) and p50 (solid); each scenario on its own scale")
	svgLegend(&b, left, 42)
	plotH := float64(h - top - bottom)
	for si, s := range r.Scenarios {
		x0 := left + si*panelW
		maxV := 1.0
		for _, m := range r.Summary {
			if m.Scenario == s.Name {
				maxV = max(maxV, m.P99Ms)
			}
		}
		maxV *= 1.1
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x0+10, h-bottom+28, s.Name)
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", x0, h-bottom, x0+panelW-20, h-bottom)
		for i := 0; i <= 4; i++ {
			v := maxV * float64(i) / 4
			y := float64(h-bottom) - plotH*float64(i)/4
			fmt.Fprintf(&b, `<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#e4e4e4"/><text x="%d" y="%.0f" text-anchor="end" fill="#666">%.0f</text>`+"\n",
				x0, y, x0+panelW-20, y, x0-3, y+4, v)
		}
		slot := float64(panelW-30) / float64(len(policies))
		for pi, p := range policies {
			for _, m := range r.Summary {
				if m.Scenario != s.Name || m.Policy != p {
					continue
				}
				x := float64(x0) + 5 + slot*float64(pi)
				for _, bar := range []struct {
					v       float64
					opacity string
				}{{m.P99Ms, "0.35"}, {m.P50Ms, "1"}} {
					bh := plotH * bar.v / maxV
					fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="%s" fill-opacity="%s"/>`+"\n",
						x, float64(h-bottom)-bh, slot*0.75, bh, policyColors[p], bar.opacity)
				}
				fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" font-size="9">%.0f</text>`+"\n",
					x+slot*0.37, float64(h-bottom)-plotH*m.P99Ms/maxV-3, m.P99Ms)
			}
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// timelineSVG draws, for the scenario with a lost cluster, each policy's
// requests within the SLO per second of arrival, with the loss marked.
func (r *results) timelineSVG() string {
	const w, h, top, bottom, left, right = 760, 320, 60, 40, 50, 20
	var b strings.Builder
	svgHeader(&b, w, h, "Cluster lost halfway: requests within the TTFT SLO per second of arrival (lines overlap where policies keep up)")
	svgLegend(&b, left, 42)
	var runs []runResult
	for _, run := range r.Runs {
		if run.Rep == 0 && strings.HasPrefix(run.Scenario, "cluster-lost") {
			runs = append(runs, run)
		}
	}
	if len(runs) == 0 {
		b.WriteString("</svg>\n")
		return b.String()
	}
	secs := len(runs[0].GoodPerSecond)
	maxV := 1
	for _, run := range runs {
		for _, v := range run.GoodPerSecond {
			maxV = max(maxV, v)
		}
	}
	maxF := float64(maxV) * 1.15
	plotW, plotH := float64(w-left-right), float64(h-top-bottom)
	x := func(s float64) float64 { return float64(left) + plotW*s/float64(secs) }
	y := func(v float64) float64 { return float64(h-bottom) - plotH*v/maxF }
	for i := 0; i <= 4; i++ {
		v := maxF * float64(i) / 4
		fmt.Fprintf(&b, `<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#e4e4e4"/><text x="%d" y="%.0f" text-anchor="end" fill="#666">%.0f</text>`+"\n",
			left, y(v), w-right, y(v), left-3, y(v)+4, v)
	}
	for s := 0; s <= secs; s += 5 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="middle" fill="#666">%d s</text>`+"\n", x(float64(s)), h-bottom+15, s)
	}
	half := r.Setup.RunSeconds / 2
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%d" x2="%.0f" y2="%d" stroke="#c00" stroke-dasharray="6 4"/><text x="%.0f" y="%d" fill="#c00">cluster lost</text>`+"\n",
		x(half), top, x(half), h-bottom, x(half)+4, top+12)
	for _, run := range runs {
		var pts []string
		for s, v := range run.GoodPerSecond[:min(secs, len(run.GoodPerSecond))] {
			pts = append(pts, fmt.Sprintf("%.0f,%.0f", x(float64(s)+0.5), y(float64(v))))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), policyColors[run.Policy])
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, h-bottom, w-right, h-bottom)
	b.WriteString("</svg>\n")
	return b.String()
}
