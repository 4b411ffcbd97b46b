package gateway

import (
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// routeTable is what one listener serves, organised as Envoy organises an
// HTTP listener: virtual hosts chosen by the Host header (exact names, then
// the longest matching wildcard suffix, then the catch-all), and within the
// chosen one the first route entry, in Gateway API precedence order, whose
// match accepts the request. A Host that selects a virtual host without a
// matching entry gets 404 even if another virtual host would match, as
// with Envoy.
type routeTable struct {
	exact     map[string]*vhost
	wildcards []*vhost // longest suffix first
	any       *vhost
}

type vhost struct {
	hostname string // "" for the catch-all, "*.example.com" for wildcards
	entries  []*routeEntry
}

// add puts an entry under each of its hostnames.
func (t *routeTable) add(e *routeEntry, hostnames []string) {
	if t.exact == nil {
		t.exact = map[string]*vhost{}
	}
	for _, h := range hostnames {
		var v *vhost
		switch {
		case h == "":
			if t.any == nil {
				t.any = &vhost{}
			}
			v = t.any
		case strings.HasPrefix(h, "*."):
			for _, w := range t.wildcards {
				if w.hostname == h {
					v = w
				}
			}
			if v == nil {
				v = &vhost{hostname: h}
				t.wildcards = append(t.wildcards, v)
			}
		default:
			if v = t.exact[h]; v == nil {
				v = &vhost{hostname: h}
				t.exact[h] = v
			}
		}
		v.entries = append(v.entries, e)
	}
}

// merge adds every entry of o under the same hostname.
func (t *routeTable) merge(o *routeTable) {
	for h, v := range o.exact {
		for _, e := range v.entries {
			t.add(e, []string{h})
		}
	}
	for _, v := range append(o.wildcards, o.any) {
		if v == nil {
			continue
		}
		for _, e := range v.entries {
			t.add(e, []string{v.hostname})
		}
	}
}

// seal orders every virtual host's entries by precedence (dropping an entry
// added twice through two listeners) and the wildcards by specificity.
func (t *routeTable) seal() {
	sortHost := func(v *vhost) {
		if v == nil {
			return
		}
		sort.SliceStable(v.entries, func(i, j int) bool { return v.entries[i].before(v.entries[j]) })
		out := v.entries[:0]
		for i, e := range v.entries {
			if i == 0 || e != v.entries[i-1] {
				out = append(out, e)
			}
		}
		v.entries = out
	}
	for _, v := range t.exact {
		sortHost(v)
	}
	for _, v := range t.wildcards {
		sortHost(v)
	}
	sortHost(t.any)
	sort.SliceStable(t.wildcards, func(i, j int) bool { return len(t.wildcards[i].hostname) > len(t.wildcards[j].hostname) })
}

// lookup picks the virtual host for a Host header value.
func (t *routeTable) lookup(host string) *vhost {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if v := t.exact[host]; v != nil {
		return v
	}
	for _, w := range t.wildcards {
		if strings.HasSuffix(host, w.hostname[1:]) {
			return w
		}
	}
	return t.any
}

// route finds the entry serving r, or nil (404).
func (t *routeTable) route(r *http.Request) *routeEntry {
	v := t.lookup(r.Host)
	if v == nil {
		return nil
	}
	for _, e := range v.entries {
		if e.matches(r) {
			return e
		}
	}
	return nil
}

// routeEntry is one match of one rule of an HTTPRoute.
type routeEntry struct {
	route   types.NamespacedName
	created time.Time
	rule    int
	match   int
	path    pathMatch
	method  string
	headers []valueMatch
	query   []valueMatch
	action  *ruleAction
}

type pathMatch struct {
	kind  gatewayv1.PathMatchType
	value string
	re    *regexp.Regexp
}

// valueMatch matches a header (name canonicalised) or a query parameter.
type valueMatch struct {
	name  string
	exact string
	re    *regexp.Regexp
}

func (m valueMatch) accepts(v string, ok bool) bool {
	if !ok {
		return false
	}
	if m.re != nil {
		return m.re.MatchString(v)
	}
	return v == m.exact
}

func (e *routeEntry) matches(r *http.Request) bool {
	if !e.path.accepts(r.URL.Path) {
		return false
	}
	if e.method != "" && r.Method != e.method {
		return false
	}
	for _, h := range e.headers {
		vs, ok := r.Header[h.name]
		// Several values of one header match as their comma-joined form,
		// the way a proxy folds them.
		if !h.accepts(strings.Join(vs, ","), ok) {
			return false
		}
	}
	if len(e.query) > 0 {
		q := r.URL.Query()
		for _, m := range e.query {
			vs, ok := q[m.name]
			// The first value decides, per the Gateway API.
			if !m.accepts(first(vs), ok) {
				return false
			}
		}
	}
	return true
}

func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

func (p pathMatch) accepts(path string) bool {
	switch p.kind {
	case gatewayv1.PathMatchExact:
		return path == p.value
	case gatewayv1.PathMatchRegularExpression:
		return p.re.MatchString(path)
	}
	return prefixMatches(p.value, path)
}

// prefixMatches is PathPrefix matching: whole path elements, a trailing "/"
// on the prefix ignored, so "/abc" matches "/abc", "/abc/" and "/abc/def"
// but not "/abcd".
func prefixMatches(prefix, path string) bool {
	prefix = strings.TrimSuffix(prefix, "/")
	if prefix == "" {
		return true
	}
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// before is the Gateway API's precedence between matches: an Exact path,
// then the longest prefix (regular expressions last, their order being
// implementation-specific), then a method match, then more header matches,
// then more query matches; ties go to the older route, then the route first
// by namespace/name, then the rule and match listed first.
func (e *routeEntry) before(o *routeEntry) bool {
	if r1, r2 := pathRank(e.path), pathRank(o.path); r1 != r2 {
		return r1 > r2
	}
	if l1, l2 := len(strings.TrimSuffix(e.path.value, "/")), len(strings.TrimSuffix(o.path.value, "/")); e.path.kind != gatewayv1.PathMatchRegularExpression && l1 != l2 {
		return l1 > l2
	}
	if (e.method != "") != (o.method != "") {
		return e.method != ""
	}
	if len(e.headers) != len(o.headers) {
		return len(e.headers) > len(o.headers)
	}
	if len(e.query) != len(o.query) {
		return len(e.query) > len(o.query)
	}
	if !e.created.Equal(o.created) {
		return e.created.Before(o.created)
	}
	if e.route != o.route {
		return e.route.String() < o.route.String()
	}
	if e.rule != o.rule {
		return e.rule < o.rule
	}
	return e.match < o.match
}

func pathRank(p pathMatch) int {
	switch p.kind {
	case gatewayv1.PathMatchExact:
		return 2
	case gatewayv1.PathMatchRegularExpression:
		return 0
	}
	return 1
}

// replacePrefix applies a ReplacePrefixMatch rewrite; the Gateway API spec's
// table of cases is in the tests.
func replacePrefix(path, prefix, replacement string) string {
	rest := strings.TrimPrefix(path, strings.TrimSuffix(prefix, "/"))
	out := strings.TrimSuffix(replacement, "/") + rest
	if !strings.HasPrefix(out, "/") {
		out = "/" + out
	}
	return out
}

// ruleAction is what a rule does with a request it matched.
type ruleAction struct {
	filters  filters
	backends []*backend
	// totalWeight is the sum of the backends' weights; 0 means every request
	// gets 500, as the Gateway API requires when all weights are zero.
	totalWeight int
	// timeout bounds the whole request, backendTimeout each upstream attempt.
	timeout, backendTimeout time.Duration
}

// pick chooses a backend by weight.
func (a *ruleAction) pick() *backend {
	if a.totalWeight <= 0 {
		return nil
	}
	n := rand.IntN(a.totalWeight)
	for _, b := range a.backends {
		if n < b.weight {
			return b
		}
		n -= b.weight
	}
	return nil
}

// filters are the HTTPRoute filters the gateway implements, rule filters
// first, then those of the chosen backendRef.
type filters struct {
	rewritePath     *gatewayv1.HTTPPathModifier
	prefix          string // the rule's PathPrefix, for ReplacePrefixMatch
	rewriteHost     string
	requestHeaders  []*gatewayv1.HTTPHeaderFilter
	responseHeaders []*gatewayv1.HTTPHeaderFilter
}

// rewrite returns the upstream path and host for a request.
func (f *filters) rewrite(path, host string) (string, string) {
	if m := f.rewritePath; m != nil {
		switch m.Type {
		case gatewayv1.FullPathHTTPPathModifier:
			path = *m.ReplaceFullPath
		case gatewayv1.PrefixMatchHTTPPathModifier:
			path = replacePrefix(path, f.prefix, *m.ReplacePrefixMatch)
		}
	}
	if f.rewriteHost != "" {
		host = f.rewriteHost
	}
	return path, host
}

// modifyHeaders applies RequestHeaderModifier or ResponseHeaderModifier
// filters in order: set, then add, then remove.
func modifyHeaders(h http.Header, mods []*gatewayv1.HTTPHeaderFilter) {
	for _, m := range mods {
		for _, s := range m.Set {
			h.Set(string(s.Name), s.Value)
		}
		for _, a := range m.Add {
			h.Add(string(a.Name), a.Value)
		}
		for _, r := range m.Remove {
			h.Del(r)
		}
	}
}
