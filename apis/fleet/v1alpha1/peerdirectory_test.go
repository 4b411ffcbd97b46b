package v1alpha1

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestParsePeerDirectoryValidatesEntries(t *testing.T) {
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"minimal", `peers: [{cluster: west, federationAddress: "10.0.0.1:9004", identity: "spiffe://f/west"}]`, ""},
		{"parent mode with gateway", `peers: [{cluster: west, federationAddress: "a:1", gatewayAddress: "b:2", identity: x, mode: Parent}]`, ""},
		{"parent mode without gateway", `peers: [{cluster: west, federationAddress: "a:1", identity: x, mode: Parent}]`, "gatewayAddress"},
		{"parent mode in lower case without gateway", `peers: [{cluster: west, federationAddress: "a:1", identity: x, mode: parent}]`, "gatewayAddress"},
		{"unknown mode", `peers: [{cluster: west, federationAddress: "a:1", identity: x, mode: Sideways}]`, "unknown federation mode"},
		{"no identity", `peers: [{cluster: west, federationAddress: "a:1"}]`, "identity is required"},
		{"bad address", `peers: [{cluster: west, federationAddress: "nowhere", identity: x}]`, "federationAddress"},
		{"bad cluster name", `peers: [{cluster: West_1, federationAddress: "a:1", identity: x}]`, "cluster"},
		{"duplicate", `peers: [{cluster: w, federationAddress: "a:1", identity: x}, {cluster: w, federationAddress: "b:1", identity: y}]`, "twice"},
		{"subscribe-only", `peers: [{cluster: edge, identity: x, subscribeOnly: true}]`, ""},
		{"subscribe-only with an address", `peers: [{cluster: edge, federationAddress: "a:1", identity: x, subscribeOnly: true}]`, "never dialled"},
		{"subscribe-only with a mode", `peers: [{cluster: edge, identity: x, subscribeOnly: true, mode: Parent}]`, "never dialled"},
		{"subscribe-only without identity", `peers: [{cluster: edge, subscribeOnly: true}]`, "identity is required"},
		{"no address", `peers: [{cluster: west, identity: x}]`, "federationAddress"},
		{"endpoint ranges", `peers: [{cluster: w, federationAddress: "a:1", identity: x, endpointCIDRs: ["10.1.0.0/16", "fd00::/64"]}]`, ""},
		{"bad endpoint range", `peers: [{cluster: w, federationAddress: "a:1", identity: x, endpointCIDRs: ["10.1.0.0"]}]`, "endpointCIDRs"},
		{"own ranges", `{ownEndpointCIDRs: ["10.2.0.0/16"], peers: []}`, ""},
		{"bad own range", `{ownEndpointCIDRs: ["ten"], peers: []}`, "ownEndpointCIDRs"},
		{"unknown field", `peers: [{cluster: w, federationAddres: "a:1", identity: x}]`, "unknown field"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePeerDirectory([]byte(tc.yaml))
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestPeerDirectoryForSelectsThePoolsPeersButNotItself(t *testing.T) {
	d, err := ParsePeerDirectory([]byte(`peers:
- {cluster: east, federationAddress: "a:1", identity: e}
- {cluster: west, federationAddress: "b:1", identity: w, pool: {namespace: llm, name: llama}}
- {cluster: central, federationAddress: "c:1", identity: c, pool: {namespace: llm, name: other}}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range d.For(types.NamespacedName{Namespace: "llm", Name: "llama"}, "east") {
		got = append(got, p.Cluster)
	}
	if strings.Join(got, ",") != "west" {
		t.Fatalf("peers %v, want [west]", got)
	}
}

// FuzzParsePeerDirectory parses arbitrary peer directories, as a picker
// reads the file the hub (or an operator) writes. A directory it accepts is
// valid and within bounds, reads back the same after writing it out, and
// gives no pool its own cluster or another pool's entries.
func FuzzParsePeerDirectory(f *testing.F) {
	f.Add([]byte(`peers: [{cluster: west, federationAddress: "10.0.0.1:9004", identity: "spiffe://f/west"}]`), "llm", "llama", "east")
	f.Add([]byte(`{"ownEndpointCIDRs":["10.1.0.0/16"],"peers":[{"cluster":"west","pool":{"namespace":"llm","name":"llama"},"federationAddress":"[fd00::1]:9004","gatewayAddress":"10.2.0.9:80","identity":"x","mode":"Parent","endpointCIDRs":["10.2.0.0/16"]}]}`), "llm", "llama", "west")
	f.Add([]byte(`peers: [{cluster: east, subscribeOnly: true, identity: e}, {cluster: west, federationAddress: "a:1", identity: w}]`), "llm", "other", "east")
	f.Add([]byte("peers: &a [*a]"), "", "", "")
	f.Add([]byte(`peers: [{cluster: west, federationAddress: "a:1", identity: x, mode: parent}]`), "a", "b", "c")
	f.Add([]byte(`peers: [{cluster: west, federationAddress: "a:1", identity: x}, {cluster: west, federationAddress: "b:1", identity: y}]`), "a", "b", "c")
	f.Fuzz(func(t *testing.T, data []byte, ns, pool, self string) {
		d, err := ParsePeerDirectory(data)
		if err != nil {
			return
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("accepted a directory that does not validate: %v", err)
		}
		if len(d.Peers) > MaxPeers {
			t.Fatalf("accepted %d peers, over %d", len(d.Peers), MaxPeers)
		}
		out, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParsePeerDirectory(out)
		if err != nil {
			t.Fatalf("the directory written out does not parse: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(d, again) {
			t.Fatalf("the directory read back differs:\n%+v\n%+v", d, again)
		}
		for _, p := range d.Peers {
			if strings.EqualFold(string(p.Mode), string(FederationParent)) && p.GatewayAddress == "" {
				t.Fatalf("accepted peer %s in Parent mode (%q) without a gateway address", p.Cluster, p.Mode)
			}
		}
		key := types.NamespacedName{Namespace: ns, Name: pool}
		for _, p := range d.For(key, self) {
			if p.Cluster == self {
				t.Fatalf("pool %s of %s gets its own cluster as a peer", key, self)
			}
			if p.Pool != nil && (p.Pool.Namespace != ns || p.Pool.Name != pool) {
				t.Fatalf("pool %s gets the entry of pool %s/%s", key, p.Pool.Namespace, p.Pool.Name)
			}
		}
	})
}
