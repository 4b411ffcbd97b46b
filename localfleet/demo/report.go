package demo

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetinfer/fleetinfer/internal/stats"
	"github.com/fleetinfer/fleetinfer/localfleet/loadgen"
)

// phaseStats summarises one load phase.
type phaseStats struct {
	Name              string
	Requests, OK      int
	Duration          time.Duration
	ReqPerS, TokPerS  float64
	TTFTp50, TTFTp99  time.Duration
	HotP50, HotP99    time.Duration
	CrossCluster      float64 // share of completed requests served in another cluster
	Served            map[string]map[string]int
	Errors            map[string]int
	results           []loadgen.Result
	began             time.Time
	hot               string
	clusters          []string
	unknownServingPod int
}

// summarize computes a phase's figures; servedBy maps namespace/pod to its
// cluster.
func summarize(name, hot string, clusters []string, began time.Time, d time.Duration, res []loadgen.Result, servedBy map[string]string) phaseStats {
	st := phaseStats{Name: name, Requests: len(res), Duration: d, Served: map[string]map[string]int{}, Errors: map[string]int{},
		results: res, began: began, hot: hot, clusters: clusters}
	var all, hotTTFT []float64
	tokens, cross := 0, 0
	for _, r := range res {
		if !r.OK() {
			st.Errors[shortError(r)]++
			continue
		}
		st.OK++
		tokens += r.Tokens
		ms := float64(r.TTFT.Microseconds()) / 1000
		all = append(all, ms)
		if r.Entry == hot {
			hotTTFT = append(hotTTFT, ms)
		}
		to := servedBy[r.Namespace+"/"+r.Pod]
		if to == "" {
			st.unknownServingPod++
			to = "?"
		}
		if st.Served[r.Entry] == nil {
			st.Served[r.Entry] = map[string]int{}
		}
		st.Served[r.Entry][to]++
		if to != r.Entry && to != "?" {
			cross++
		}
	}
	secs := d.Seconds()
	st.ReqPerS, st.TokPerS = float64(st.OK)/secs, float64(tokens)/secs
	st.TTFTp50, st.TTFTp99 = quantileMs(all, 0.5), quantileMs(all, 0.99)
	st.HotP50, st.HotP99 = quantileMs(hotTTFT, 0.5), quantileMs(hotTTFT, 0.99)
	if st.OK > 0 {
		st.CrossCluster = float64(cross) / float64(st.OK)
	}
	return st
}

func shortError(r loadgen.Result) string {
	if r.Status != 0 && r.Status != 200 {
		return fmt.Sprintf("HTTP %d", r.Status)
	}
	msg := r.Err
	if i := strings.IndexByte(msg, ':'); i > 0 && len(msg) > 60 {
		msg = msg[:i]
	}
	return msg
}

func quantileMs(v []float64, q float64) time.Duration {
	return time.Duration(stats.Quantile(v, q) * float64(time.Millisecond))
}

// printPhase prints a phase's figures and its traffic matrix.
func printPhase(out io.Writer, st phaseStats) {
	fmt.Fprintf(out, "    %d requests in %s: %d completed (%.1f req/s, %.0f tokens/s)", st.Requests, st.Duration.Round(time.Second), st.OK, st.ReqPerS, st.TokPerS)
	if n := st.Requests - st.OK; n > 0 {
		fmt.Fprintf(out, ", %d failed (%s)", n, errorList(st.Errors))
	}
	fmt.Fprintf(out, "\n    TTFT p50 %s, p99 %s; entering %s: p50 %s, p99 %s\n", ms(st.TTFTp50), ms(st.TTFTp99), st.hot, ms(st.HotP50), ms(st.HotP99))
	fmt.Fprintf(out, "    served in another cluster: %.0f%% of completed requests\n", 100*st.CrossCluster)
	if st.unknownServingPod > 0 {
		fmt.Fprintf(out, "    (%d answered by a pod no cluster holds any more, shown as ?)\n", st.unknownServingPod)
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "    ENTERED \\ SERVED IN\t%s\n", strings.Join(st.clusters, "\t"))
	for _, from := range st.clusters {
		row := []string{}
		for _, to := range st.clusters {
			row = append(row, fmt.Sprint(st.Served[from][to]))
		}
		fmt.Fprintf(tw, "    %s\t%s\n", from, strings.Join(row, "\t"))
	}
	_ = tw.Flush()
}

func errorList(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%d× %s", v, k))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

func ms(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }

// writeReport writes report.md with two plots into dir and returns its path.
func writeReport(dir string, header string, phases []phaseStats) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("# fleetinfer local fleet demo\n\n")
	b.WriteString(header)
	b.WriteString("\n## Results\n\n| phase | requests | completed | req/s | tokens/s | TTFT p50 | TTFT p99 | hot entry p50 | hot entry p99 | served in another cluster |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, st := range phases {
		fmt.Fprintf(&b, "| %s | %d | %d | %.1f | %.0f | %s | %s | %s | %s | %.0f%% |\n", st.Name, st.Requests, st.OK, st.ReqPerS, st.TokPerS,
			ms(st.TTFTp50), ms(st.TTFTp99), ms(st.HotP50), ms(st.HotP99), 100*st.CrossCluster)
	}
	b.WriteString("\n![time to first token over time](ttft.svg)\n\n![traffic between clusters](traffic.svg)\n\n")
	for _, st := range phases {
		fmt.Fprintf(&b, "### %s: where requests were served\n\n| entered \\ served in | %s |\n|---|%s\n", st.Name, strings.Join(st.clusters, " | "), strings.Repeat("---|", len(st.clusters)))
		for _, from := range st.clusters {
			row := []string{}
			for _, to := range st.clusters {
				row = append(row, fmt.Sprint(st.Served[from][to]))
			}
			fmt.Fprintf(&b, "| %s | %s |\n", from, strings.Join(row, " | "))
		}
		if len(st.Errors) > 0 {
			fmt.Fprintf(&b, "\nFailed requests: %s.\n", errorList(st.Errors))
		}
		b.WriteString("\n")
	}
	files := map[string]string{"report.md": b.String(), "ttft.svg": ttftSVG(phases), "traffic.svg": trafficSVG(phases)}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	abs, err := filepath.Abs(filepath.Join(dir, "report.md"))
	if err != nil {
		return "", err
	}
	return abs, nil
}

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"}

// ttftSVG plots, per second of each phase, the p50 and p99 TTFT of requests
// entering the hot cluster, phases side by side on one time axis.
func ttftSVG(phases []phaseStats) string {
	const w, h, left, right, top, bottom = 720.0, 320.0, 60.0, 20.0, 40.0, 40.0
	type point struct{ t, p50, p99 float64 }
	var series [][]point
	offset, maxT, maxV := 0.0, 0.0, 1.0
	var bounds []float64
	for _, st := range phases {
		buckets := map[int][]float64{}
		for _, r := range st.results {
			if r.OK() && r.Entry == st.hot {
				sec := int(r.Start.Sub(st.began).Seconds())
				buckets[sec] = append(buckets[sec], float64(r.TTFT.Milliseconds()))
			}
		}
		var pts []point
		for sec := 0; sec <= int(st.Duration.Seconds()); sec++ {
			if v := buckets[sec]; len(v) > 0 {
				p := point{offset + float64(sec), float64(quantileMs(v, 0.5).Milliseconds()), float64(quantileMs(v, 0.99).Milliseconds())}
				pts = append(pts, p)
				maxV = max(maxV, p.p99)
			}
		}
		series = append(series, pts)
		offset += st.Duration.Seconds() + 2
		bounds = append(bounds, offset-1)
		maxT = offset
	}
	x := func(t float64) float64 { return left + t/maxT*(w-left-right) }
	y := func(v float64) float64 { return h - bottom - v/maxV*(h-top-bottom) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", w, h)
	hot := ""
	if len(phases) > 0 {
		hot = phases[0].hot
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="14">TTFT of requests entering %s, per second (p50 solid, p99 dashed)</text>`+"\n", left, hot)
	for _, v := range []float64{0, maxV / 2, maxV} {
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/><text x="%.0f" y="%.1f" text-anchor="end">%.0f ms</text>`+"\n",
			left, y(v), w-right, y(v), left-4, y(v)+4, v)
	}
	start := 0.0
	for i, pts := range series {
		c := palette[i%len(palette)]
		var p50, p99 []string
		for _, p := range pts {
			p50 = append(p50, fmt.Sprintf("%.1f,%.1f", x(p.t), y(p.p50)))
			p99 = append(p99, fmt.Sprintf("%.1f,%.1f", x(p.t), y(p.p99)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(p50, " "))
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" stroke-dasharray="5,3" points="%s"/>`+"\n", c, strings.Join(p99, " "))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" fill="%s">%s</text>`+"\n", x(start)+4, top-6, c, phases[i].Name)
		start = bounds[i] + 1
		if i < len(series)-1 {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#999" stroke-dasharray="2,2"/>`+"\n", x(bounds[i]), top, x(bounds[i]), h-bottom)
		}
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">seconds into the load</text>`+"\n", (w+left)/2, h-10)
	b.WriteString("</svg>\n")
	return b.String()
}

// trafficSVG draws, per phase and entry cluster, a bar split by the cluster
// that served the requests.
func trafficSVG(phases []phaseStats) string {
	if len(phases) == 0 {
		return `<svg xmlns="http://www.w3.org/2000/svg"/>`
	}
	clusters := phases[0].clusters
	const barH, gap, left, top = 22.0, 8.0, 190.0, 40.0
	w := 720.0
	rows := len(phases) * len(clusters)
	h := top + float64(rows)*(barH+gap) + float64(len(phases))*16 + 40
	maxN := 1
	for _, st := range phases {
		for _, row := range st.Served {
			n := 0
			for _, v := range row {
				n += v
			}
			maxN = max(maxN, n)
		}
	}
	scale := (w - left - 20) / float64(maxN)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="10" y="18" font-size="14">Requests by the cluster they entered (rows) and the cluster that served them (colours)</text>`+"\n")
	for i, c := range clusters {
		fmt.Fprintf(&b, `<rect x="%.0f" y="24" width="10" height="10" fill="%s"/><text x="%.0f" y="33">served in %s</text>`+"\n",
			10+float64(i)*140, palette[i%len(palette)], 24+float64(i)*140, c)
	}
	yPos := top + 10
	for _, st := range phases {
		fmt.Fprintf(&b, `<text x="10" y="%.0f" font-weight="bold">%s</text>`+"\n", yPos+10, st.Name)
		yPos += 16
		for _, from := range clusters {
			fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="end">entered %s</text>`+"\n", left-6, yPos+barH*0.7, from)
			xPos := left
			for i, to := range clusters {
				n := st.Served[from][to]
				if n == 0 {
					continue
				}
				bw := float64(n) * scale
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s"><title>%s → %s: %d</title></rect>`+"\n",
					xPos, yPos, bw, barH, palette[i%len(palette)], from, to, n)
				if bw > 24 {
					fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" fill="white" text-anchor="middle">%d</text>`+"\n", xPos+bw/2, yPos+barH*0.7, n)
				}
				xPos += bw
			}
			yPos += barH + gap
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}
