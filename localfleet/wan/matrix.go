package wan

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Matrix holds the links between named clusters. Links are symmetric: the
// link from a to b is the link from b to a.
type Matrix struct {
	clusters []string
	links    map[pair]Link
}

// pair is an unordered pair of clusters, stored in sorted order.
type pair struct{ a, b string }

func pairOf(a, b string) pair {
	if b < a {
		a, b = b, a
	}
	return pair{a, b}
}

// Regions of the default matrix, with the round trips between them measured
// by IBM Cloud between its VPC regions: "Inter-region latency", average
// latency in ms, 31 Aug 2024 – 29 Sep 2024, in IBM Cloud's VPC network
// latency dashboard (source: github.com/ibm-cloud-docs/vpc,
// _include-segments/network-latency.md). Washington DC–Dallas 31 ms,
// Dallas–Toronto 34 ms, Washington DC–Toronto 19 ms (20 ms the other way).
//
// Two clusters placed in the same region are ~2 ms apart: the same dashboard's
// inter-AZ latency within a region (Dallas 1–2–3 from 1.9 to 2.4 ms).
var defaultRegions = []string{"washington-dc", "dallas", "toronto"}

var defaultRTT = map[pair]time.Duration{
	pairOf("washington-dc", "dallas"):  31 * time.Millisecond,
	pairOf("dallas", "toronto"):        34 * time.Millisecond,
	pairOf("washington-dc", "toronto"): 19 * time.Millisecond,
}

const (
	// DefaultSameRegionRTT is the round trip between two clusters the default
	// matrix places in the same region (an inter-zone round trip).
	DefaultSameRegionRTT = 2 * time.Millisecond
	// DefaultBandwidth is 1 Gbit/s in bytes per second.
	DefaultBandwidth = 1_000_000_000 / 8
)

// DefaultRegion is the region Default places the i-th cluster in: the three
// regions of the default matrix in turn (Washington DC, Dallas, Toronto).
func DefaultRegion(i int) string { return defaultRegions[i%len(defaultRegions)] }

// Default is a matrix for clusters modelled on three real regions: the i-th
// cluster is placed in DefaultRegion(i), so the first three clusters get the
// published round trips between Washington DC, Dallas and Toronto (31, 34 and
// 19 ms; see defaultRegions), and a fourth cluster shares the first one's
// region (DefaultSameRegionRTT away from it). Every link has jitter of 5% of
// its RTT, DefaultBandwidth and no loss. Duplicate names are ignored.
func Default(clusters []string) *Matrix {
	m := &Matrix{links: map[pair]Link{}}
	for _, c := range clusters {
		if !slices.Contains(m.clusters, c) {
			m.clusters = append(m.clusters, c)
		}
	}
	for i, a := range m.clusters {
		for j, b := range m.clusters[:i] {
			rtt := DefaultSameRegionRTT
			if ra, rb := DefaultRegion(i), DefaultRegion(j); ra != rb {
				rtt = defaultRTT[pairOf(ra, rb)]
			}
			m.links[pairOf(a, b)] = Link{RTT: rtt, Jitter: rtt / 20, Bandwidth: DefaultBandwidth}
		}
	}
	return m
}

// Clusters returns the clusters in the order they were given.
func (m *Matrix) Clusters() []string { return slices.Clone(m.clusters) }

// Link returns the link between a and b. A cluster to itself is direct: the
// zero Link, which needs no proxy. A cluster the matrix does not name is an
// error.
func (m *Matrix) Link(a, b string) (Link, error) {
	for _, c := range []string{a, b} {
		if !slices.Contains(m.clusters, c) {
			return Link{}, m.unknown(c)
		}
	}
	if a == b {
		return Link{}, nil
	}
	return m.links[pairOf(a, b)], nil
}

// Set replaces the link between two different clusters of the matrix.
func (m *Matrix) Set(a, b string, l Link) error {
	if _, err := m.Link(a, b); err != nil {
		return err
	}
	if a == b {
		return fmt.Errorf("wan: a link joins two clusters, not %q to itself", a)
	}
	if err := l.Validate(); err != nil {
		return fmt.Errorf("wan: link between %s and %s: %w", a, b, err)
	}
	m.links[pairOf(a, b)] = l
	return nil
}

func (m *Matrix) unknown(c string) error {
	return fmt.Errorf("wan: unknown cluster %q (the matrix has %s)", c, strings.Join(m.clusters, ", "))
}

// The file form of a matrix, shared by make demo, the benchmarks and the
// tests:
//
//	clusters: [east, west, central]
//	default:              # optional: every pair not listed under links
//	  rtt: 30ms
//	links:
//	- between: [east, west]
//	  rtt: 31ms           # Go duration
//	  jitter: 1.55ms      # Go duration, bound of the extra round-trip delay
//	  bandwidth: 125000000  # bytes per second per direction, 0 = unlimited
//	  loss: 0             # probability per chunk, 0 to 1
//
// Without a default, every pair of different clusters needs a link.
type matrixFile struct {
	Clusters []string   `json:"clusters"`
	Default  *linkFile  `json:"default,omitempty"`
	Links    []linkFile `json:"links,omitempty"`
}

type linkFile struct {
	Between   []string `json:"between,omitempty"`
	RTT       string   `json:"rtt,omitempty"`
	Jitter    string   `json:"jitter,omitempty"`
	Bandwidth int64    `json:"bandwidth,omitempty"`
	Loss      float64  `json:"loss,omitempty"`
}

func (f linkFile) link() (Link, error) {
	var l Link
	for _, d := range []struct {
		name, s string
		to      *time.Duration
	}{{"rtt", f.RTT, &l.RTT}, {"jitter", f.Jitter, &l.Jitter}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil {
			return Link{}, fmt.Errorf("%s %q is not a duration such as 30ms", d.name, d.s)
		}
		*d.to = v
	}
	l.Bandwidth, l.Loss = f.Bandwidth, f.Loss
	return l, l.Validate()
}

func fileLink(l Link, between []string) linkFile {
	return linkFile{Between: between, RTT: l.RTT.String(), Jitter: l.Jitter.String(), Bandwidth: l.Bandwidth, Loss: l.Loss}
}

// Load reads a matrix file (YAML or JSON).
func Load(path string) (*Matrix, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("wan: %w", err)
	}
	m, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// Parse reads a matrix in its file form (YAML or JSON) and validates it:
// unknown fields, unknown or repeated clusters, a pair given twice, a link
// from a cluster to itself, negative values, a loss outside [0, 1] and a
// missing pair without a default are errors that say where they are.
func Parse(data []byte) (*Matrix, error) {
	var f matrixFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("wan: matrix: %w", err)
	}
	if len(f.Clusters) == 0 {
		return nil, errors.New("wan: matrix: no clusters")
	}
	m := &Matrix{links: map[pair]Link{}}
	for i, c := range f.Clusters {
		switch {
		case c == "":
			return nil, fmt.Errorf("wan: matrix: clusters[%d] is empty", i)
		case slices.Contains(m.clusters, c):
			return nil, fmt.Errorf("wan: matrix: cluster %q is listed twice", c)
		}
		m.clusters = append(m.clusters, c)
	}
	for i, lf := range f.Links {
		at := fmt.Sprintf("wan: matrix: links[%d]", i)
		if len(lf.Between) != 2 {
			return nil, fmt.Errorf("%s: between must name two clusters, not %d", at, len(lf.Between))
		}
		a, b := lf.Between[0], lf.Between[1]
		for _, c := range lf.Between {
			if !slices.Contains(m.clusters, c) {
				return nil, fmt.Errorf("%s: unknown cluster %q (clusters: %s)", at, c, strings.Join(m.clusters, ", "))
			}
		}
		if a == b {
			return nil, fmt.Errorf("%s: a link joins two clusters, not %q to itself (a cluster reaches itself directly)", at, a)
		}
		if _, dup := m.links[pairOf(a, b)]; dup {
			return nil, fmt.Errorf("%s: the link between %s and %s is given twice", at, a, b)
		}
		l, err := lf.link()
		if err != nil {
			return nil, fmt.Errorf("%s (%s–%s): %w", at, a, b, err)
		}
		m.links[pairOf(a, b)] = l
	}
	var def *Link
	if f.Default != nil {
		if len(f.Default.Between) > 0 {
			return nil, errors.New("wan: matrix: default applies to every pair without a link; it takes no between")
		}
		l, err := f.Default.link()
		if err != nil {
			return nil, fmt.Errorf("wan: matrix: default: %w", err)
		}
		def = &l
	}
	for i, a := range m.clusters {
		for _, b := range m.clusters[:i] {
			if _, ok := m.links[pairOf(a, b)]; ok {
				continue
			}
			if def == nil {
				return nil, fmt.Errorf("wan: matrix: no link between %s and %s, and no default", b, a)
			}
			m.links[pairOf(a, b)] = *def
		}
	}
	return m, nil
}

// YAML is the matrix in its file form, every pair listed, for Parse or Load
// to read back (make demo can write Default to a file the tests share).
func (m *Matrix) YAML() ([]byte, error) {
	f := matrixFile{Clusters: m.Clusters()}
	for i, a := range m.clusters {
		for _, b := range m.clusters[:i] {
			f.Links = append(f.Links, fileLink(m.links[pairOf(a, b)], []string{b, a}))
		}
	}
	return yaml.Marshal(f)
}

// Place adds cluster c to the matrix next to cluster like (in its region):
// c's link to every other cluster is like's, and its link to like is l.
func (m *Matrix) Place(c, like string, l Link) error {
	if slices.Contains(m.clusters, c) {
		return fmt.Errorf("wan: cluster %q is already in the matrix", c)
	}
	if _, err := m.Link(like, like); err != nil {
		return err
	}
	if err := l.Validate(); err != nil {
		return fmt.Errorf("wan: link between %s and %s: %w", c, like, err)
	}
	for _, o := range m.clusters {
		if o != like {
			m.links[pairOf(c, o)] = m.links[pairOf(like, o)]
		}
	}
	m.links[pairOf(c, like)] = l
	m.clusters = append(m.clusters, c)
	return nil
}

// Clone returns a copy that changes apart from m.
func (m *Matrix) Clone() *Matrix {
	c := &Matrix{clusters: slices.Clone(m.clusters), links: make(map[pair]Link, len(m.links))}
	for p, l := range m.links {
		c.links[p] = l
	}
	return c
}
