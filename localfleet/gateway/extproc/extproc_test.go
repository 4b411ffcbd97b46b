package extproc

import (
	"errors"
	"net/http"
	"reflect"
	"regexp"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func set(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}}
}

func TestHeaderMutationFollowsEnvoyDefaults(t *testing.T) {
	request := headers{{":method", "POST"}, {":authority", "a.test"}, {":path", "/v1/completions"}, {"content-length", "10"}, {"x-multi", "1"}, {"x-multi", "2"}}
	tests := []struct {
		name     string
		dir      direction
		start    headers
		mutation *extprocv3.HeaderMutation
		want     headers
		rejected int
	}{{
		name: "set without append action overwrites every value in place",
		dir:  requestHeaders, start: request,
		mutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-multi", "3"), set("Content-Length", "12")}},
		want:     headers{{":method", "POST"}, {":authority", "a.test"}, {":path", "/v1/completions"}, {"content-length", "12"}, {"x-multi", "3"}},
	}, {
		name: "the legacy append flag adds a value",
		dir:  requestHeaders, start: headers{{"x-a", "1"}},
		mutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: &corev3.HeaderValue{Key: "x-a", RawValue: []byte("2")}, Append: wrapperspb.Bool(true)}}},
		want: headers{{"x-a", "1"}, {"x-a", "2"}},
	}, {
		name: "explicit append actions",
		dir:  requestHeaders, start: headers{{"x-present", "1"}},
		mutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: &corev3.HeaderValue{Key: "x-present", RawValue: []byte("2")}, AppendAction: corev3.HeaderValueOption_ADD_IF_ABSENT},
			{Header: &corev3.HeaderValue{Key: "x-absent", RawValue: []byte("2")}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS},
			{Header: &corev3.HeaderValue{Key: "x-new", RawValue: []byte("3")}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
		}},
		want: headers{{"x-present", "1"}, {"x-new", "3"}},
	}, {
		name: "value is read when raw_value is empty",
		dir:  requestHeaders, start: nil,
		mutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-v", Value: "old-style"}}}},
		want:     headers{{"x-v", "old-style"}},
	}, {
		name: "routing and envoy headers are not the processor's to change",
		dir:  requestHeaders, start: request,
		mutation: &extprocv3.HeaderMutation{
			SetHeaders:    []*corev3.HeaderValueOption{set(":authority", "b.test"), set("host", "b.test"), set(":method", "GET"), set("x-envoy-retry-on", "5xx"), set(":path", "/v2")},
			RemoveHeaders: []string{":path", "host", "x-multi"},
		},
		want:     headers{{":method", "POST"}, {":authority", "a.test"}, {":path", "/v2"}, {"content-length", "10"}},
		rejected: 6,
	}, {
		name: "a response may get a valid :status, not an invalid one",
		dir:  responseHeaders, start: headers{{":status", "200"}},
		mutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set(":status", "429"), set(":status", "99"), set(":path", "/x")}},
		want:     headers{{":status", "429"}},
		rejected: 2,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := append(headers(nil), tt.start...)
			rejected, err := h.apply(tt.dir, tt.mutation)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(h, tt.want) || rejected != tt.rejected {
				t.Errorf("got %v (%d rejected), want %v (%d rejected)", h, rejected, tt.want, tt.rejected)
			}
		})
	}
}

func TestMalformedHeaderMutationIsAProtocolError(t *testing.T) {
	for _, m := range []*extprocv3.HeaderMutation{
		{SetHeaders: []*corev3.HeaderValueOption{set("bad header", "v")}},
		{SetHeaders: []*corev3.HeaderValueOption{set("x-ok", "line\r\nbreak")}},
		{RemoveHeaders: []string{"bad header"}},
	} {
		var h headers
		var pe *ProtocolError
		if _, err := h.apply(requestHeaders, m); !errors.As(err, &pe) {
			t.Errorf("%v: error %v, want a ProtocolError", m, err)
		}
	}
}

func TestDestinationMustAgreeInHeaderAndMetadata(t *testing.T) {
	lb := func(v string) *structpb.Struct {
		s, _ := structpb.NewStruct(map[string]any{LBNamespace: map[string]any{DestinationHeader: v}})
		return s
	}
	tests := []struct {
		name      string
		header    string
		metadata  *structpb.Struct
		extra     headers
		endpoints []string
		violation string
	}{
		{name: "primary and fallback", header: "127.0.0.1:8000,127.0.0.2:8000", metadata: lb("127.0.0.1:8000,127.0.0.2:8000"),
			endpoints: []string{"127.0.0.1:8000", "127.0.0.2:8000"}},
		{name: "other headers set with it", header: "127.12.254.1:8080", metadata: lb("127.12.254.1:8080"),
			extra: headers{{"x-fleetinfer-origin", "east"}}, endpoints: []string{"127.12.254.1:8080"}},
		{name: "header missing", metadata: lb("127.0.0.1:8000"), violation: "no x-gateway-destination-endpoint header"},
		{name: "metadata missing", header: "127.0.0.1:8000", violation: "no envoy.lb/x-gateway-destination-endpoint dynamic metadata"},
		{name: "values differ", header: "127.0.0.1:8000", metadata: lb("127.0.0.2:8000"), violation: "differs"},
		{name: "not ip:port", header: "pod-a:8000", metadata: lb("pod-a:8000"), violation: "is not ip:port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &Exchange{pick: Pick{DynamicMetadata: tt.metadata}}
			h := append(headers{}, tt.extra...)
			if tt.header != "" {
				h.add(DestinationHeader, tt.header)
			}
			err := e.readDestination(h)
			if tt.violation != "" {
				if err == nil || !regexp.MustCompile(tt.violation).MatchString(err.Error()) {
					t.Fatalf("error %v, want one matching %q", err, tt.violation)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(e.pick.Endpoints, tt.endpoints) {
				t.Errorf("endpoints %v (err %v), want %v", e.pick.Endpoints, err, tt.endpoints)
			}
		})
	}
}

func TestSubsetHintMetadata(t *testing.T) {
	if md := requestMetadata(nil); md != nil {
		t.Errorf("no hint: metadata %v, want none", md)
	}
	empty := requestMetadata([]string{}).GetFilterMetadata()[SubsetNamespace].AsMap()
	if l, ok := empty[SubsetKey].([]any); !ok || len(l) != 0 {
		t.Errorf("empty hint: %v, want an empty list", empty)
	}
	md := responseMetadata("127.0.0.1:8000,127.0.0.2:8000", []string{"127.0.0.2:8000"}).GetFilterMetadata()
	want := map[string]any{DestinationHeader: "127.0.0.1:8000,127.0.0.2:8000"}
	if got := md[LBNamespace].AsMap(); !reflect.DeepEqual(got, want) {
		t.Errorf("envoy.lb %v, want %v", got, want)
	}
	if got := md[SubsetNamespace].AsMap()[SubsetKey]; !reflect.DeepEqual(got, []any{"127.0.0.2:8000"}) {
		t.Errorf("subset %v", got)
	}
}

// The client's address goes with the request headers as Envoy sends the
// source.address attribute envoy.yaml's request_attributes lists.
func TestSourceAddressAttribute(t *testing.T) {
	if a := requestAttributes(""); a != nil {
		t.Errorf("no address: attributes %v, want none", a)
	}
	got := requestAttributes("10.0.0.1:40000")[AttributesKey].AsMap()
	if want := map[string]any{SourceAddressAttribute: "10.0.0.1:40000"}; !reflect.DeepEqual(got, want) {
		t.Errorf("attributes %v, want %v", got, want)
	}
}

func TestSplitEndpoints(t *testing.T) {
	for in, want := range map[string][]string{
		"":                                 nil,
		"127.0.0.1:8000":                   {"127.0.0.1:8000"},
		" 127.0.0.1:8000 , 127.0.0.2:8000": {"127.0.0.1:8000", "127.0.0.2:8000"},
		",,":                               nil,
	} {
		if got := SplitEndpoints(in); !reflect.DeepEqual(got, want) {
			t.Errorf("SplitEndpoints(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestImmediateResponseBecomesTheHTTPAnswer(t *testing.T) {
	ir, err := immediate(&extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("retry-after", "1")}},
		Body:    []byte("saturated"),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := &ImmediateResponse{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"1"}}, Body: []byte("saturated")}
	if !reflect.DeepEqual(ir, want) {
		t.Errorf("got %+v, want %+v", ir, want)
	}
	if ir, _ := immediate(&extprocv3.ImmediateResponse{}); ir.Status != http.StatusInternalServerError {
		t.Errorf("no status: %d, want 500", ir.Status)
	}
}
