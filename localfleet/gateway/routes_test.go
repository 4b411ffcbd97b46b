package gateway

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// The Gateway API's own table for ReplacePrefixMatch (HTTPPathModifier).
func TestReplacePrefixMatchFollowsTheSpecTable(t *testing.T) {
	tests := []struct{ path, prefix, replace, want string }{
		{"/foo/bar", "/foo", "/xyz", "/xyz/bar"},
		{"/foo/bar", "/foo", "/xyz/", "/xyz/bar"},
		{"/foo/bar", "/foo/", "/xyz", "/xyz/bar"},
		{"/foo/bar", "/foo/", "/xyz/", "/xyz/bar"},
		{"/foo", "/foo", "/xyz", "/xyz"},
		{"/foo/", "/foo", "/xyz", "/xyz/"},
		{"/foo/bar", "/foo", "", "/bar"},
		{"/foo/", "/foo", "", "/"},
		{"/foo", "/foo", "", "/"},
		{"/foo/", "/foo", "/", "/"},
		{"/foo", "/foo", "/", "/"},
		// KServe's managed route: /<ns>/<name>/v1/... to the pool's /v1/...
		{"/team/llama/v1/completions", "/team/llama/v1", "/v1", "/v1/completions"},
	}
	for _, tt := range tests {
		if got := replacePrefix(tt.path, tt.prefix, tt.replace); got != tt.want {
			t.Errorf("replacePrefix(%q, %q, %q) = %q, want %q", tt.path, tt.prefix, tt.replace, got, tt.want)
		}
	}
}

func TestPathPrefixMatchesWholeElements(t *testing.T) {
	tests := []struct {
		prefix, path string
		want         bool
	}{
		{"/abc", "/abc", true}, {"/abc", "/abc/", true}, {"/abc", "/abc/def", true}, {"/abc", "/abcd", false},
		{"/abc/", "/abc", true}, {"/abc/", "/abc/def", true}, {"/", "/anything", true}, {"/v1", "/v2/x", false},
	}
	for _, tt := range tests {
		if got := prefixMatches(tt.prefix, tt.path); got != tt.want {
			t.Errorf("prefixMatches(%q, %q) = %v, want %v", tt.prefix, tt.path, got, tt.want)
		}
	}
}

func TestListenerAndRouteHostnamesIntersect(t *testing.T) {
	h := func(s string) *gatewayv1.Hostname { return ptr.To(gatewayv1.Hostname(s)) }
	hs := func(s ...string) []gatewayv1.Hostname {
		out := make([]gatewayv1.Hostname, len(s))
		for i, v := range s {
			out[i] = gatewayv1.Hostname(v)
		}
		return out
	}
	tests := []struct {
		name     string
		listener *gatewayv1.Hostname
		route    []gatewayv1.Hostname
		want     []string
	}{
		{"neither names a host", nil, nil, []string{""}},
		{"only the route does", nil, hs("a.example.com"), []string{"a.example.com"}},
		{"only the listener does", h("a.example.com"), nil, []string{"a.example.com"}},
		{"route name under listener wildcard", h("*.example.com"), hs("a.example.com", "b.other.com"), []string{"a.example.com"}},
		{"route wildcard over listener name", h("a.example.com"), hs("*.example.com"), []string{"a.example.com"}},
		{"narrower route wildcard", h("*.example.com"), hs("*.b.example.com"), []string{"*.b.example.com"}},
		{"wildcard does not cover its apex", h("*.example.com"), hs("example.com"), nil},
		{"case does not matter", h("A.Example.com"), hs("a.example.COM"), []string{"a.example.com"}},
	}
	for _, tt := range tests {
		if got := intersectHostnames(tt.listener, tt.route); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestVirtualHostIsChosenByExactNameThenLongestWildcardThenCatchAll(t *testing.T) {
	var rt routeTable
	entry := func(name string) *routeEntry {
		return &routeEntry{route: types.NamespacedName{Name: name}, path: pathMatch{kind: gatewayv1.PathMatchPathPrefix, value: "/"}}
	}
	rt.add(entry("exact"), []string{"a.b.example.com"})
	rt.add(entry("short"), []string{"*.example.com"})
	rt.add(entry("long"), []string{"*.b.example.com"})
	rt.add(entry("any"), []string{""})
	rt.seal()
	for host, want := range map[string]string{
		"a.b.example.com:8080": "exact", "c.b.example.com": "long", "c.example.com": "short",
		"example.com": "any", "A.B.EXAMPLE.COM.": "exact",
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Host = host
		if e := rt.route(r); e == nil || e.route.Name != want {
			t.Errorf("host %q: got %v, want %s", host, e, want)
		}
	}
}

// Precedence across rules of all routes: Exact path, longest prefix, method,
// most headers, most query parameters, oldest route, name, rule order.
func TestMatchPrecedenceFollowsTheGatewayAPI(t *testing.T) {
	old, young := time.Unix(100, 0), time.Unix(200, 0)
	prefix := func(v string) pathMatch { return pathMatch{kind: gatewayv1.PathMatchPathPrefix, value: v} }
	e := func(name string, created time.Time, rule int, p pathMatch, method string, headers, query int) *routeEntry {
		en := &routeEntry{route: types.NamespacedName{Namespace: "ns", Name: name}, created: created, rule: rule, path: p, method: method}
		for range headers {
			en.headers = append(en.headers, valueMatch{name: "X-H", exact: "1"})
		}
		for range query {
			en.query = append(en.query, valueMatch{name: "q", exact: "1"})
		}
		return en
	}
	ordered := []*routeEntry{
		e("exact", young, 0, pathMatch{kind: gatewayv1.PathMatchExact, value: "/v1/completions"}, "", 0, 0),
		e("longer-prefix", young, 0, prefix("/v1/completions"), "", 0, 0),
		e("method", young, 0, prefix("/v1"), http.MethodPost, 0, 0),
		e("two-headers", young, 0, prefix("/v1"), "", 2, 0),
		e("one-header", young, 0, prefix("/v1"), "", 1, 1),
		e("query", young, 0, prefix("/v1"), "", 0, 1),
		e("older", old, 0, prefix("/v1"), "", 0, 0),
		e("a-name", young, 0, prefix("/v1"), "", 0, 0),
		e("b-name", young, 0, prefix("/v1"), "", 0, 0),
		e("b-name", young, 1, prefix("/v1"), "", 0, 0),
		e("shortest", old, 0, prefix("/"), "", 0, 0),
	}
	var rt routeTable
	for i := len(ordered) - 1; i >= 0; i-- {
		rt.add(ordered[i], []string{""})
	}
	rt.seal()
	if !reflect.DeepEqual(rt.any.entries, ordered) {
		for i, en := range rt.any.entries {
			t.Logf("%d: %s rule %d", i, en.route.Name, en.rule)
		}
		t.Fatal("entries not in Gateway API precedence order")
	}
}

func TestMatchChecksPathMethodHeadersAndQuery(t *testing.T) {
	re, _ := anchored("v[0-9]+")
	e := &routeEntry{
		path:    pathMatch{kind: gatewayv1.PathMatchPathPrefix, value: "/v1"},
		method:  http.MethodPost,
		headers: []valueMatch{{name: "X-Model", exact: "llama"}, {name: "X-Version", re: re}},
		query:   []valueMatch{{name: "tier", exact: "gold"}},
	}
	tests := []struct {
		name, method, target string
		headers              map[string]string
		want                 bool
	}{
		{"all conditions hold", "POST", "/v1/completions?tier=gold", map[string]string{"X-Model": "llama", "X-Version": "v2"}, true},
		{"header names are case-insensitive", "POST", "/v1?tier=gold", map[string]string{"x-model": "llama", "x-version": "v10"}, true},
		{"the regular expression matches whole values", "POST", "/v1?tier=gold", map[string]string{"X-Model": "llama", "X-Version": "v2-beta"}, false},
		{"wrong method", "GET", "/v1?tier=gold", map[string]string{"X-Model": "llama", "X-Version": "v2"}, false},
		{"missing header", "POST", "/v1?tier=gold", map[string]string{"X-Version": "v2"}, false},
		{"wrong query value", "POST", "/v1?tier=silver", map[string]string{"X-Model": "llama", "X-Version": "v2"}, false},
		{"path outside the prefix", "POST", "/v10?tier=gold", map[string]string{"X-Model": "llama", "X-Version": "v2"}, false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(tt.method, tt.target, nil)
		for k, v := range tt.headers {
			r.Header.Set(k, v)
		}
		if got := e.matches(r); got != tt.want {
			t.Errorf("%s: matches = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestFiltersRewriteAndModifyHeaders(t *testing.T) {
	f := filters{
		rewritePath: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/v1")},
		prefix:      "/ns/model/v1", rewriteHost: "model.internal",
		requestHeaders: []*gatewayv1.HTTPHeaderFilter{{
			Set:    []gatewayv1.HTTPHeader{{Name: "X-Set", Value: "new"}},
			Add:    []gatewayv1.HTTPHeader{{Name: "X-Add", Value: "2"}},
			Remove: []string{"X-Drop"},
		}},
	}
	b := &backend{filters: f}
	if path, host := rewrite(b, "/ns/model/v1/completions?stream=true", "gw.test"); path != "/v1/completions?stream=true" || host != "model.internal" {
		t.Errorf("rewrite: %s %s", path, host)
	}
	h := http.Header{"X-Set": {"old"}, "X-Add": {"1"}, "X-Drop": {"x"}}
	modifyHeaders(h, f.requestHeaders)
	if want := (http.Header{"X-Set": {"new"}, "X-Add": {"1", "2"}}); !reflect.DeepEqual(h, want) {
		t.Errorf("headers %v, want %v", h, want)
	}
}

func TestBackendsAreChosenByWeight(t *testing.T) {
	a, b, zero := &backend{label: "a", weight: 3}, &backend{label: "b", weight: 1}, &backend{label: "zero", weight: 0}
	action := &ruleAction{backends: []*backend{a, zero, b}, totalWeight: 4}
	counts := map[string]int{}
	for range 4000 {
		counts[action.pick().label]++
	}
	if counts["zero"] != 0 || counts["a"] < 2700 || counts["a"] > 3300 {
		t.Errorf("4000 picks at weights 3:0:1 gave %v", counts)
	}
	if (&ruleAction{backends: []*backend{zero}}).pick() != nil {
		t.Error("a rule whose weights are all zero picked a backend")
	}
}
