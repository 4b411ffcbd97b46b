package wan

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestDefaultMatrixHasThePublishedRoundTrips(t *testing.T) {
	m := Default([]string{"east", "west", "central", "hub"})
	ms := time.Millisecond
	for _, tc := range []struct {
		a, b string
		rtt  time.Duration
	}{
		{"east", "west", 31 * ms},    // Washington DC – Dallas
		{"west", "central", 34 * ms}, // Dallas – Toronto
		{"east", "central", 19 * ms}, // Washington DC – Toronto
		{"hub", "east", 2 * ms},      // both in Washington DC
		{"hub", "west", 31 * ms},
		{"hub", "central", 19 * ms},
	} {
		for _, order := range [][2]string{{tc.a, tc.b}, {tc.b, tc.a}} {
			l, err := m.Link(order[0], order[1])
			if err != nil {
				t.Fatal(err)
			}
			want := Link{RTT: tc.rtt, Jitter: tc.rtt / 20, Bandwidth: 125_000_000}
			if l != want {
				t.Errorf("Link(%s, %s) = %v, want %v", order[0], order[1], l, want)
			}
		}
	}
	if l, err := m.Link("west", "west"); err != nil || !l.IsDirect() {
		t.Errorf("Link(west, west) = %v, %v; want direct", l, err)
	}
	if _, err := m.Link("east", "north"); err == nil || !strings.Contains(err.Error(), `"north"`) {
		t.Errorf("Link(east, north) error = %v, want one naming north", err)
	}
	if got := m.Clusters(); !reflect.DeepEqual(got, []string{"east", "west", "central", "hub"}) {
		t.Errorf("Clusters() = %v", got)
	}
}

func TestMatrixYAMLReadsBackTheSame(t *testing.T) {
	m := Default([]string{"east", "west", "central"})
	if err := m.Set("west", "east", Link{RTT: 80 * time.Millisecond, Loss: 0.01}); err != nil {
		t.Fatal(err)
	}
	data, err := m.YAML()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(data)
	if err != nil {
		t.Fatalf("Parse(YAML()) = %v\n%s", err, data)
	}
	if !reflect.DeepEqual(back, m) {
		t.Errorf("read back %+v, want %+v\n%s", back, m, data)
	}
}

func TestParseFillsMissingPairsFromTheDefault(t *testing.T) {
	m, err := Parse([]byte(`
clusters: [hub, east, west]
default: {rtt: 30ms, jitter: 1ms}
links:
- between: [west, east]
  rtt: 65ms
  bandwidth: 1000
  loss: 0.5
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		a, b string
		want Link
	}{
		{"east", "west", Link{RTT: 65 * time.Millisecond, Bandwidth: 1000, Loss: 0.5}},
		{"hub", "west", Link{RTT: 30 * time.Millisecond, Jitter: time.Millisecond}},
		{"east", "hub", Link{RTT: 30 * time.Millisecond, Jitter: time.Millisecond}},
	} {
		if l, _ := m.Link(tc.a, tc.b); l != tc.want {
			t.Errorf("Link(%s, %s) = %v, want %v", tc.a, tc.b, l, tc.want)
		}
	}
	// JSON is YAML too.
	if _, err := Parse([]byte(`{"clusters":["a","b"],"links":[{"between":["a","b"],"rtt":"5ms"}]}`)); err != nil {
		t.Errorf("JSON: %v", err)
	}
}

func TestParseErrorsNameTheProblem(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"no clusters", `links: []`, "no clusters"},
		{"unknown field", "clusters: [a, b]\nlinkz: []", "linkz"},
		{"repeated cluster", "clusters: [a, a]", `cluster "a" is listed twice`},
		{"unknown cluster", "clusters: [a, b]\nlinks:\n- between: [a, c]\n  rtt: 5ms", `links[0]: unknown cluster "c"`},
		{"self link", "clusters: [a, b]\nlinks:\n- between: [a, a]", `not "a" to itself`},
		{"three clusters", "clusters: [a, b, c]\nlinks:\n- between: [a, b, c]", "between must name two clusters, not 3"},
		{"pair twice", "clusters: [a, b]\nlinks:\n- between: [a, b]\n- between: [b, a]", "links[1]: the link between b and a is given twice"},
		{"negative rtt", "clusters: [a, b]\nlinks:\n- between: [a, b]\n  rtt: -5ms", "links[0] (a–b): rtt -5ms is negative"},
		{"negative jitter", "clusters: [a, b]\ndefault: {jitter: -1ms}", "default: jitter -1ms is negative"},
		{"negative bandwidth", "clusters: [a, b]\nlinks:\n- between: [a, b]\n  bandwidth: -1", "bandwidth -1 bytes/s is negative"},
		{"loss above one", "clusters: [a, b]\nlinks:\n- between: [a, b]\n  loss: 1.5", "loss 1.5 is not a probability"},
		{"bad duration", "clusters: [a, b]\nlinks:\n- between: [a, b]\n  rtt: 30", `rtt "30" is not a duration`},
		{"missing pair", "clusters: [a, b, c]\nlinks:\n- between: [a, b]", "no link between a and c, and no default"},
		{"default with between", "clusters: [a, b]\ndefault: {between: [a, b]}", "default applies to every pair"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestSetRejectsWhatParseRejects(t *testing.T) {
	m := Default([]string{"a", "b"})
	for _, tc := range []struct {
		a, b string
		l    Link
	}{
		{"a", "c", Link{}},
		{"a", "a", Link{RTT: time.Millisecond}},
		{"a", "b", Link{Jitter: -1}},
	} {
		if err := m.Set(tc.a, tc.b, tc.l); err == nil {
			t.Errorf("Set(%s, %s, %v) succeeded", tc.a, tc.b, tc.l)
		}
	}
}
