// Command diagram draws an SVG picture from a plain-text description of its
// boxes, groups, lines and labels, so that a picture in docs/images is made
// from a source in the repository and changes by review like code. It has no
// layout engine: the description places everything, and the command refuses
// a picture whose parts overlap (text wider than its box, a box across a
// group's border, a line through a box or a label, labels on each other),
// estimating text widths on the wide side so that any common sans-serif
// font fits. The output depends only on the description.
//
//	go run ./hack/diagram -in hack/diagram/architecture.txt -out docs/images/architecture.svg
//
// The description, one item a line (# starts a comment; strings in double
// quotes, Go syntax):
//
//	canvas W H
//	title "what the picture shows, for screen readers"
//	group ID X Y W H "title"
//	box ID X Y W H STYLE "bold first line" "more lines"...
//	text X Y ANCHOR STYLE "text"         ANCHOR: start, middle or end; Y is the baseline
//	line STYLE ENDS POINT POINT...       ENDS: -> <- <-> or -
//	repeat NAME@X,Y NAME@X,Y...          the lines up to `end` once per NAME, their
//	end                                  positions offset by X,Y and $ replaced by NAME
//
// A POINT is X,Y or a box's side, ID.t, ID.b, ID.l or ID.r: its middle, or
// with @F the fraction F of the way from its top or left end, or with +D
// D pixels from that end. A line that ends on a box's side may touch that
// box; it may cross no other box.
// The styles are in the tables below.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

func main() {
	in := flag.String("in", "hack/diagram/architecture.txt", "the description")
	out := flag.String("out", "docs/images/architecture.svg", "the SVG to write")
	flag.Parse()
	src, err := os.ReadFile(*in)
	if err != nil {
		fatal(err)
	}
	svg, err := Render(src, *in)
	if err != nil {
		fatal(fmt.Errorf("%s: %w", *in, err))
	}
	if err := os.WriteFile(*out, svg, 0o644); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "diagram:", err)
	os.Exit(1)
}

// Box styles: fill and stroke.
var boxStyles = map[string][2]string{
	"hub":     {"#dbe8fb", "#2f5f9e"},
	"control": {"#e8effa", "#2f5f9e"},
	"data":    {"#fdeedd", "#b35c00"},
	"picker":  {"#e3f4e6", "#2b7a3a"},
	"object":  {"#f3f3f3", "#666666"},
	"actor":   {"#ffffff", "#444444"},
}

// Line styles: colour, width, dash pattern.
type lineStyle struct {
	color string
	width float64
	dash  string
}

var lineStyles = map[string]lineStyle{
	"control":    {"#2f5f9e", 2, ""},
	"request":    {"#b35c00", 2, ""},
	"crossing":   {"#b35c00", 2.5, "7 4"},
	"federation": {"#2b7a3a", 2.5, ""},
	"relation":   {"#777777", 1.5, "3 3"},
}

// Text styles: size, weight, colour.
type textStyle struct {
	size   float64
	bold   bool
	italic bool
	color  string
}

var textStyles = map[string]textStyle{
	"label":      {12, false, false, "#222222"},
	"control":    {12, false, false, "#2f5f9e"},
	"request":    {12, false, false, "#b35c00"},
	"federation": {12, false, false, "#2b7a3a"},
	"note":       {12, false, true, "#555555"},
	"heading":    {14, true, false, "#222222"},
}

const (
	groupTitleSize = 14
	boxTitleSize   = 13
	boxLineSize    = 12
	lineHeight     = 16
	fontFamily     = "DejaVu Sans, Verdana, Arial, Helvetica, sans-serif"
)

type rect struct{ x, y, w, h float64 }

func (r rect) overlaps(o rect) bool {
	return r.x < o.x+o.w && o.x < r.x+r.w && r.y < o.y+o.h && o.y < r.y+r.h
}

func (r rect) contains(o rect) bool {
	return o.x >= r.x && o.y >= r.y && o.x+o.w <= r.x+r.w && o.y+o.h <= r.y+r.h
}

func (r rect) inset(d float64) rect { return rect{r.x + d, r.y + d, r.w - 2*d, r.h - 2*d} }

type group struct {
	id    string
	r     rect
	title string
	line  int
}

type box struct {
	id    string
	r     rect
	style string
	lines []string
	line  int
}

type text struct {
	x, y   float64
	anchor string
	style  string
	s      string
	line   int
}

type point struct {
	x, y float64
	box  string // the box whose side the point is on, if any
}

type line struct {
	style  string
	ends   string
	points []point
	line   int
}

type diagram struct {
	w, h   float64
	title  string
	groups []group
	boxes  []box
	texts  []text
	lines  []line
	byID   map[string]rect
}

// Render parses a description, checks that its parts do not overlap and
// returns the SVG; source names the description in the SVG's first comment.
func Render(src []byte, source string) ([]byte, error) {
	d, err := parse(src)
	if err != nil {
		return nil, err
	}
	if err := d.check(); err != nil {
		return nil, err
	}
	return d.svg(source), nil
}

// instance is one placement of a repeat block.
type instance struct {
	name   string
	dx, dy float64
}

func parse(src []byte) (*diagram, error) {
	d := &diagram{byID: map[string]rect{}}
	var block []numbered
	var repeat []instance
	inRepeat := false
	for i, raw := range strings.Split(string(src), "\n") {
		n := i + 1
		l := strings.TrimSpace(raw)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f, err := fields(l)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		switch {
		case f[0] == "repeat":
			if inRepeat {
				return nil, fmt.Errorf("line %d: repeat inside repeat", n)
			}
			inRepeat, block, repeat = true, nil, nil
			for _, a := range f[1:] {
				name, at, ok := strings.Cut(a, "@")
				if !ok {
					return nil, fmt.Errorf("line %d: %q is not NAME@X,Y", n, a)
				}
				x, y, err := pair(at)
				if err != nil {
					return nil, fmt.Errorf("line %d: %w", n, err)
				}
				repeat = append(repeat, instance{name, x, y})
			}
		case f[0] == "end":
			if !inRepeat {
				return nil, fmt.Errorf("line %d: end without repeat", n)
			}
			inRepeat = false
			for _, in := range repeat {
				for _, b := range block {
					if err := d.item(b.f, in, b.n); err != nil {
						return nil, fmt.Errorf("line %d (%s): %w", b.n, in.name, err)
					}
				}
			}
		case inRepeat:
			block = append(block, numbered{f, n})
		default:
			if err := d.item(f, instance{}, n); err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
		}
	}
	if inRepeat {
		return nil, fmt.Errorf("repeat without end")
	}
	if d.w == 0 || d.h == 0 {
		return nil, fmt.Errorf("no canvas")
	}
	// Points on boxes resolve once every box is known.
	for i := range d.lines {
		for j, p := range d.lines[i].points {
			if p.box == "" {
				continue
			}
			q, err := d.side(p.box)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", d.lines[i].line, err)
			}
			d.lines[i].points[j] = q
		}
	}
	return d, nil
}

type numbered struct {
	f []string
	n int
}

// fields splits a line into words and double-quoted Go strings.
func fields(l string) ([]string, error) {
	var f []string
	for l = strings.TrimSpace(l); l != ""; l = strings.TrimSpace(l) {
		if l[0] == '"' {
			q, err := strconv.QuotedPrefix(l)
			if err != nil {
				return nil, fmt.Errorf("bad string: %s", l)
			}
			s, _ := strconv.Unquote(q)
			f = append(f, "\x00"+s) // marked as a string
			l = l[len(q):]
			continue
		}
		end := strings.IndexAny(l, " \t")
		if end < 0 {
			end = len(l)
		}
		f = append(f, l[:end])
		l = l[end:]
	}
	return f, nil
}

func isString(s string) bool { return strings.HasPrefix(s, "\x00") }

func pair(s string) (float64, float64, error) {
	a, b, ok := strings.Cut(s, ",")
	if !ok {
		return 0, 0, fmt.Errorf("%q is not X,Y", s)
	}
	x, err1 := strconv.ParseFloat(a, 64)
	y, err2 := strconv.ParseFloat(b, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("%q is not X,Y", s)
	}
	return x, y, nil
}

// nums parses the numbers of f, offsetting x (even) and y (odd) ones.
func nums(f []string, in instance) ([]float64, error) {
	v := make([]float64, len(f))
	for i, s := range f {
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", s)
		}
		if i%2 == 0 {
			x += in.dx
		} else {
			x += in.dy
		}
		v[i] = x
	}
	return v, nil
}

func (d *diagram) item(f []string, in instance, n int) error {
	f = slices.Clone(f) // a repeat's block serves every instance
	for i := range f {
		f[i] = strings.ReplaceAll(f[i], "$", in.name)
	}
	strs := func(f []string) ([]string, error) {
		var out []string
		for _, s := range f {
			if !isString(s) {
				return nil, fmt.Errorf("%q is not a quoted string", s)
			}
			out = append(out, s[1:])
		}
		return out, nil
	}
	want := func(k int) error {
		if len(f) < k {
			return fmt.Errorf("%s needs at least %d fields", f[0], k-1)
		}
		return nil
	}
	switch f[0] {
	case "canvas":
		if len(f) != 3 {
			return fmt.Errorf("canvas W H")
		}
		v, err := nums(f[1:], instance{})
		if err != nil {
			return err
		}
		d.w, d.h = v[0], v[1]
	case "title":
		s, err := strs(f[1:])
		if err != nil || len(s) != 1 {
			return fmt.Errorf("title \"text\"")
		}
		d.title = s[0]
	case "group", "box":
		if err := want(7); err != nil {
			return err
		}
		id := f[1]
		if _, dup := d.byID[id]; dup {
			return fmt.Errorf("%q is defined twice", id)
		}
		at, err := nums(f[2:4], in)
		if err != nil {
			return err
		}
		size, err := nums(f[4:6], instance{})
		if err != nil {
			return err
		}
		r := rect{at[0], at[1], size[0], size[1]}
		d.byID[id] = r
		if f[0] == "group" {
			s, err := strs(f[6:])
			if err != nil || len(s) != 1 {
				return fmt.Errorf("group ID X Y W H \"title\"")
			}
			d.groups = append(d.groups, group{id, r, s[0], n})
			return nil
		}
		if _, ok := boxStyles[f[6]]; !ok {
			return fmt.Errorf("no box style %q", f[6])
		}
		s, err := strs(f[7:])
		if err != nil || len(s) == 0 {
			return fmt.Errorf("box ID X Y W H STYLE \"line\"...")
		}
		d.boxes = append(d.boxes, box{id, r, f[6], s, n})
	case "text":
		if len(f) != 6 {
			return fmt.Errorf("text X Y ANCHOR STYLE \"text\"")
		}
		v, err := nums(f[1:3], in)
		if err != nil {
			return err
		}
		if f[3] != "start" && f[3] != "middle" && f[3] != "end" {
			return fmt.Errorf("no anchor %q", f[3])
		}
		if _, ok := textStyles[f[4]]; !ok {
			return fmt.Errorf("no text style %q", f[4])
		}
		s, err := strs(f[5:])
		if err != nil {
			return err
		}
		d.texts = append(d.texts, text{v[0], v[1], f[3], f[4], s[0], n})
	case "line":
		if err := want(5); err != nil {
			return err
		}
		if _, ok := lineStyles[f[1]]; !ok {
			return fmt.Errorf("no line style %q", f[1])
		}
		switch f[2] {
		case "->", "<-", "<->", "-":
		default:
			return fmt.Errorf("no line ends %q", f[2])
		}
		l := line{style: f[1], ends: f[2], line: n}
		for _, p := range f[3:] {
			if !strings.ContainsAny(p[:1], "0123456789-") {
				l.points = append(l.points, point{box: p})
				continue
			}
			x, y, err := pair(p)
			if err != nil {
				return err
			}
			l.points = append(l.points, point{x: x + in.dx, y: y + in.dy})
		}
		d.lines = append(d.lines, l)
	default:
		return fmt.Errorf("unknown item %q", f[0])
	}
	return nil
}

// side resolves ID.S, ID.S@F or ID.S+D to a point on a box's side: its
// middle, the fraction F of it, or D pixels from its top or left end.
func (d *diagram) side(ref string) (point, error) {
	spec, frac, px := ref, 0.5, -1.0
	if i := strings.IndexAny(ref, "@+"); i >= 0 {
		spec = ref[:i]
		v, err := strconv.ParseFloat(ref[i+1:], 64)
		if err != nil || v < 0 || (ref[i] == '@' && v > 1) {
			return point{}, fmt.Errorf("%q: @ takes a fraction from 0 to 1, + a distance in pixels", ref)
		}
		if ref[i] == '@' {
			frac = v
		} else {
			px = v
		}
	}
	dot := strings.LastIndex(spec, ".")
	if dot < 0 {
		return point{}, fmt.Errorf("%q is not ID.SIDE", ref)
	}
	id, s := spec[:dot], spec[dot+1:]
	r, ok := d.byID[id]
	if !ok {
		return point{}, fmt.Errorf("%q: no box %q", ref, id)
	}
	along := func(length float64) float64 {
		if px >= 0 {
			return px
		}
		return frac * length
	}
	switch s {
	case "t":
		return point{r.x + along(r.w), r.y, id}, nil
	case "b":
		return point{r.x + along(r.w), r.y + r.h, id}, nil
	case "l":
		return point{r.x, r.y + along(r.h), id}, nil
	case "r":
		return point{r.x + r.w, r.y + along(r.h), id}, nil
	}
	return point{}, fmt.Errorf("%q: the side must be t, b, l or r", ref)
}

// textWidth estimates the width of s at size on the wide side: a little
// over DejaVu Sans' and Verdana's widths (the widest common sans-serif
// fonts), so that text that fits by this estimate fits in any of them.
func textWidth(s string, size float64, bold bool) float64 {
	w := 0.0
	for _, r := range s {
		switch {
		case strings.ContainsRune("iljI.,:;'|!()[] ", r):
			w += 0.32
		case strings.ContainsRune("ftr-/", r):
			w += 0.42
		case strings.ContainsRune("mw", r):
			w += 0.95
		case strings.ContainsRune("MW", r):
			w += 0.9
		case r == '→' || r == '↔' || r == '←' || r == '↑' || r == '↓':
			w += 0.9
		case r >= 'A' && r <= 'Z':
			w += 0.7
		default:
			w += 0.62
		}
	}
	if bold {
		w *= 1.08
	}
	return w * size
}

// textRect is the area a text takes: from its baseline up by the size and
// down by a quarter of it (descenders).
func textRect(x, y float64, anchor, s string, size float64, bold bool) rect {
	w := textWidth(s, size, bold)
	switch anchor {
	case "middle":
		x -= w / 2
	case "end":
		x -= w
	}
	return rect{x, y - size, w, size * 1.25}
}

func groupTitleRect(g group) rect {
	return textRect(g.r.x+12, g.r.y+22, "start", g.title, groupTitleSize, true)
}

func (t text) rect() rect {
	st := textStyles[t.style]
	return textRect(t.x, t.y, t.anchor, t.s, st.size, st.bold)
}

const padding = 6 // between a box's border and its text

// check refuses a picture whose parts overlap or leave the canvas.
func (d *diagram) check() error {
	canvas := rect{0, 0, d.w, d.h}
	var errs []string
	bad := func(n int, format string, a ...any) {
		errs = append(errs, fmt.Sprintf("line %d: ", n)+fmt.Sprintf(format, a...))
	}
	for i, g := range d.groups {
		if !canvas.contains(g.r) {
			bad(g.line, "group %s leaves the canvas", g.id)
		}
		if tr := groupTitleRect(g); !g.r.contains(tr) {
			bad(g.line, "the title of group %s is wider than the group", g.id)
		}
		for _, o := range d.groups[:i] {
			if g.r.overlaps(o.r) && !g.r.contains(o.r) && !o.r.contains(g.r) {
				bad(g.line, "group %s overlaps group %s", g.id, o.id)
			}
		}
	}
	for i, b := range d.boxes {
		if !canvas.contains(b.r) {
			bad(b.line, "box %s leaves the canvas", b.id)
		}
		if h := float64(len(b.lines))*lineHeight + 2*padding; h > b.r.h {
			bad(b.line, "box %s is %g high, its %d lines need %g", b.id, b.r.h, len(b.lines), h)
		}
		for j, s := range b.lines {
			size, bold := float64(boxLineSize), false
			if j == 0 {
				size, bold = boxTitleSize, true
			}
			if w := textWidth(s, size, bold) + 2*padding; w > b.r.w {
				bad(b.line, "box %s is %g wide, %q needs %.0f", b.id, b.r.w, s, w)
			}
		}
		for _, o := range d.boxes[:i] {
			if b.r.overlaps(o.r) {
				bad(b.line, "box %s overlaps box %s", b.id, o.id)
			}
		}
		for _, g := range d.groups {
			if b.r.overlaps(g.r) && !g.r.contains(b.r) {
				bad(b.line, "box %s lies across the border of group %s", b.id, g.id)
			}
			if g.r.contains(b.r) && b.r.overlaps(groupTitleRect(g)) {
				bad(b.line, "box %s covers the title of group %s", b.id, g.id)
			}
		}
	}
	// Free text: on the canvas, off boxes, group titles and other text.
	for i, t := range d.texts {
		r := t.rect()
		if !canvas.contains(r) {
			bad(t.line, "text %q leaves the canvas", t.s)
		}
		for _, b := range d.boxes {
			if r.overlaps(b.r) {
				bad(t.line, "text %q overlaps box %s", t.s, b.id)
			}
		}
		for _, g := range d.groups {
			if r.overlaps(groupTitleRect(g)) {
				bad(t.line, "text %q overlaps the title of group %s", t.s, g.id)
			}
			if r.overlaps(g.r) && !g.r.contains(r) {
				bad(t.line, "text %q lies across the border of group %s", t.s, g.id)
			}
		}
		for _, o := range d.texts[:i] {
			if r.overlaps(o.rect()) {
				bad(t.line, "text %q overlaps text %q", t.s, o.s)
			}
		}
	}
	// Lines: through no box but the ones they end on, no text, no title.
	for _, l := range d.lines {
		for k := 0; k+1 < len(l.points); k++ {
			a, b := l.points[k], l.points[k+1]
			if !canvas.contains(rect{math.Min(a.x, b.x), math.Min(a.y, b.y), math.Abs(a.x - b.x), math.Abs(a.y - b.y)}) {
				bad(l.line, "a line leaves the canvas")
			}
			for _, bx := range d.boxes {
				if (bx.id == a.box || bx.id == b.box) && (k == 0 || k+2 == len(l.points)) {
					// A segment that ends on a box's side touches it; it
					// must still not run inside it.
					if segmentHits(a, b, bx.r.inset(1)) {
						bad(l.line, "a line runs inside box %s", bx.id)
					}
					continue
				}
				if segmentHits(a, b, bx.r.inset(-2)) {
					bad(l.line, "a line crosses box %s", bx.id)
				}
			}
			for _, t := range d.texts {
				if segmentHits(a, b, t.rect().inset(-2)) {
					bad(l.line, "a line crosses text %q", t.s)
				}
			}
			for _, g := range d.groups {
				if segmentHits(a, b, groupTitleRect(g).inset(-2)) {
					bad(l.line, "a line crosses the title of group %s", g.id)
				}
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("the picture has overlaps:\n  %s", strings.Join(errs, "\n  "))
	}
	return nil
}

// segmentHits reports whether the segment ab meets the inside of r
// (Liang–Barsky clipping).
func segmentHits(a, b point, r rect) bool {
	if r.w <= 0 || r.h <= 0 {
		return false
	}
	t0, t1 := 0.0, 1.0
	dx, dy := b.x-a.x, b.y-a.y
	clip := func(p, q float64) bool {
		if p == 0 {
			return q > 0
		}
		t := q / p
		if p < 0 {
			if t > t1 {
				return false
			}
			t0 = math.Max(t0, t)
		} else {
			if t < t0 {
				return false
			}
			t1 = math.Min(t1, t)
		}
		return true
	}
	if !clip(-dx, a.x-r.x) || !clip(dx, r.x+r.w-a.x) || !clip(-dy, a.y-r.y) || !clip(dy, r.y+r.h-a.y) {
		return false
	}
	return t0 < t1
}

func num(v float64) string { return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) }

func esc(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '"':
			b.WriteString("&quot;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func (d *diagram) svg(source string) []byte {
	var b bytes.Buffer
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n")
	p("<!-- Generated by hack/diagram from %s: edit that and run `go run ./hack/diagram -in %s -out <this file>`. -->\n", source, source)
	p("<svg xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" width=\"%s\" height=\"%s\" viewBox=\"0 0 %s %s\" font-family=\"%s\">\n",
		num(d.w), num(d.h), num(d.w), num(d.h), fontFamily)
	if d.title != "" {
		p("<title>%s</title>\n", esc(d.title))
	}
	// One pair of arrowheads per line colour, in a fixed order.
	p("<defs>\n")
	for _, name := range slices.Sorted(maps.Keys(lineStyles)) {
		c := lineStyles[name].color
		p("<marker id=\"end-%s\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"10\" markerHeight=\"10\" markerUnits=\"userSpaceOnUse\" orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"%s\"/></marker>\n", name, c)
		p("<marker id=\"start-%s\" viewBox=\"0 0 10 10\" refX=\"0\" refY=\"5\" markerWidth=\"10\" markerHeight=\"10\" markerUnits=\"userSpaceOnUse\" orient=\"auto\"><path d=\"M10,0 L0,5 L10,10 z\" fill=\"%s\"/></marker>\n", name, c)
	}
	p("</defs>\n")
	p("<rect x=\"0\" y=\"0\" width=\"%s\" height=\"%s\" fill=\"#ffffff\"/>\n", num(d.w), num(d.h))
	for _, g := range d.groups {
		p("<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" rx=\"10\" fill=\"#fafafa\" stroke=\"#9a9a9a\" stroke-width=\"1.5\"/>\n",
			num(g.r.x), num(g.r.y), num(g.r.w), num(g.r.h))
		p("<text x=\"%s\" y=\"%s\" font-size=\"%d\" font-weight=\"bold\" fill=\"#333333\">%s</text>\n",
			num(g.r.x+12), num(g.r.y+22), groupTitleSize, esc(g.title))
	}
	for _, bx := range d.boxes {
		st := boxStyles[bx.style]
		p("<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" rx=\"6\" fill=\"%s\" stroke=\"%s\" stroke-width=\"1.5\"/>\n",
			num(bx.r.x), num(bx.r.y), num(bx.r.w), num(bx.r.h), st[0], st[1])
		top := bx.r.y + (bx.r.h-float64(len(bx.lines))*lineHeight)/2
		for j, s := range bx.lines {
			y := top + float64(j)*lineHeight + 12.5
			weight, size := "", boxLineSize
			if j == 0 {
				weight, size = " font-weight=\"bold\"", boxTitleSize
			}
			p("<text x=\"%s\" y=\"%s\" font-size=\"%d\"%s text-anchor=\"middle\" fill=\"#1a1a1a\">%s</text>\n",
				num(bx.r.x+bx.r.w/2), num(y), size, weight, esc(s))
		}
	}
	for _, l := range d.lines {
		st := lineStyles[l.style]
		var pts []string
		for _, pt := range l.points {
			pts = append(pts, num(pt.x)+","+num(pt.y))
		}
		attrs := ""
		if st.dash != "" {
			attrs += fmt.Sprintf(" stroke-dasharray=\"%s\"", st.dash)
		}
		if l.ends == "->" || l.ends == "<->" {
			attrs += fmt.Sprintf(" marker-end=\"url(#end-%s)\"", l.style)
		}
		if l.ends == "<-" || l.ends == "<->" {
			attrs += fmt.Sprintf(" marker-start=\"url(#start-%s)\"", l.style)
		}
		p("<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\" stroke-linejoin=\"round\"%s/>\n",
			strings.Join(pts, " "), st.color, num(st.width), attrs)
	}
	for _, t := range d.texts {
		st := textStyles[t.style]
		attrs := ""
		if st.bold {
			attrs += " font-weight=\"bold\""
		}
		if st.italic {
			attrs += " font-style=\"italic\""
		}
		if t.anchor != "start" {
			attrs += fmt.Sprintf(" text-anchor=\"%s\"", t.anchor)
		}
		p("<text x=\"%s\" y=\"%s\" font-size=\"%s\"%s fill=\"%s\">%s</text>\n",
			num(t.x), num(t.y), num(st.size), attrs, st.color, esc(t.s))
	}
	p("</svg>\n")
	return b.Bytes()
}
