package extproc

import (
	"net"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
	eppmetadata "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"
)

// Names of the Endpoint Picker Protocol (GIE proposal 004), as GIE's EPP
// defines them.
const (
	// DestinationHeader carries the picked endpoint(s), "ip:port" with
	// comma-separated fallbacks, in the EPP's request header mutation.
	DestinationHeader = eppmetadata.DestinationEndpointKey
	// LBNamespace is the dynamic-metadata namespace holding the same value
	// under DestinationHeader.
	LBNamespace = eppmetadata.DestinationEndpointNamespace
	// SubsetNamespace and SubsetKey carry the subset hint: the list of
	// "ip:port" the EPP must pick from.
	SubsetNamespace = eppmetadata.SubsetFilterNamespace
	SubsetKey       = eppmetadata.SubsetFilterKey
	// RequestIDHeader is the request id Envoy's connection manager adds.
	RequestIDHeader = "x-request-id"
	// AttributesKey is where Envoy's ext_proc filter puts the attributes
	// its request_attributes list; SourceAddressAttribute, the downstream
	// client's ip:port, is the one deploy/envoy/envoy.yaml lists (the
	// picker budgets request bodies per client by it).
	AttributesKey          = "envoy.filters.http.ext_proc"
	SourceAddressAttribute = "source.address"
)

// SplitEndpoints parses a destination or subset value: comma-separated
// "ip:port" entries, blanks ignored.
func SplitEndpoints(v string) []string {
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// validEndpoints checks that every entry is host:port with a literal IP, the
// only form an ORIGINAL_DST or override-host load balancer can dial.
func validEndpoints(eps []string) error {
	for _, e := range eps {
		host, port, err := net.SplitHostPort(e)
		if err != nil || net.ParseIP(host) == nil || port == "" {
			return protocolErrorf("destination %q is not ip:port", e)
		}
	}
	return nil
}

// stringList renders endpoints as the structpb list Envoy puts in metadata.
func stringList(eps []string) *structpb.Value {
	vals := make([]*structpb.Value, len(eps))
	for i, e := range eps {
		vals[i] = structpb.NewStringValue(e)
	}
	return structpb.NewListValue(&structpb.ListValue{Values: vals})
}

// requestMetadata is the metadata_context of request-phase messages: the
// subset hint when there is one. Envoy forwards the stream's dynamic
// metadata with every message, and GIE's EPP reads it from the message that
// completes the body, so it goes on each one.
func requestMetadata(subset []string) *corev3.Metadata {
	if subset == nil {
		return nil
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		SubsetNamespace: {Fields: map[string]*structpb.Value{SubsetKey: stringList(subset)}},
	}}
}

// requestAttributes are the attributes of the request-headers message: the
// client's address, when known.
func requestAttributes(source string) map[string]*structpb.Struct {
	if source == "" {
		return nil
	}
	return map[string]*structpb.Struct{AttributesKey: {Fields: map[string]*structpb.Value{
		SourceAddressAttribute: structpb.NewStringValue(source)}}}
}

// responseMetadata is the metadata_context of response-phase messages: the
// envoy.lb namespace as deploy/envoy/envoy.yaml forwards it (the EPP's
// destination, which the stream's dynamic metadata kept), plus the subset
// hint if the request had one. The Endpoint Picker Protocol also asks a data
// plane to report the endpoint that served
// (x-gateway-destination-endpoint-served); Envoy's ORIGINAL_DST cluster
// writes no such entry, so neither does this client.
func responseMetadata(destination string, subset []string) *corev3.Metadata {
	lb := map[string]*structpb.Value{}
	if destination != "" {
		lb[DestinationHeader] = structpb.NewStringValue(destination)
	}
	md := requestMetadata(subset)
	if md == nil {
		md = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	}
	md.FilterMetadata[LBNamespace] = &structpb.Struct{Fields: lb}
	return md
}

// metadataString reads namespace/key of dynamic metadata as a string; a list
// of strings is joined with commas.
func metadataString(md *structpb.Struct, namespace, key string) (string, bool) {
	ns := md.GetFields()[namespace].GetStructValue()
	v, ok := ns.GetFields()[key]
	if !ok {
		return "", false
	}
	if l := v.GetListValue(); l != nil {
		parts := make([]string, 0, len(l.GetValues()))
		for _, e := range l.GetValues() {
			parts = append(parts, e.GetStringValue())
		}
		return strings.Join(parts, ","), true
	}
	return v.GetStringValue(), true
}

// mergeMetadata folds src into dst namespace by namespace, as Envoy merges
// the dynamic_metadata of successive processor responses.
func mergeMetadata(dst **structpb.Struct, src *structpb.Struct) {
	if src == nil {
		return
	}
	if *dst == nil {
		*dst = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	for ns, v := range src.GetFields() {
		cur := (*dst).Fields[ns].GetStructValue()
		add := v.GetStructValue()
		if cur == nil || add == nil {
			(*dst).Fields[ns] = v
			continue
		}
		for k, kv := range add.GetFields() {
			cur.Fields[k] = kv
		}
	}
}
