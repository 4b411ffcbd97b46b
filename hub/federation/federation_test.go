package federation

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/federation/ca"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
)

const (
	ns      = "team"
	svcName = "llama"
)

// newSpoke is a cluster holding objs, on the pod network every spoke
// shares unless a test says otherwise.
func newSpoke(name string, objs ...client.Object) *hubtest.Spoke {
	s := hubtest.NewSpoke(name, objs...)
	s.Labels[fleetv1alpha1.PodNetworkLabel] = "flat"
	return s
}

// copyOf is the hub's copy of the service in a cluster, federated in mode,
// reporting st.
func copyOf(cluster string, mode fleetv1alpha1.FederationMode, st *v1alpha2.FederationStatus) *v1alpha2.LLMInferenceService {
	cp := &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svcName, UID: types.UID(cluster + "-copy"),
		Annotations: map[string]string{fleetv1alpha1.FederationClusterAnnotation: cluster, fleetv1alpha1.FederationModeAnnotation: string(mode)}}}
	fleetv1alpha1.MarkOwnedByHub(cp, hubtest.HubID)
	cp.Status.Federation = st
	return cp
}

func reports(picker, gateway string) *v1alpha2.FederationStatus {
	return &v1alpha2.FederationStatus{PickerAddress: picker, GatewayAddress: gateway}
}

// fixture is a hub with one service and the spokes that may run it.
type fixture struct {
	*hubtest.Fleet
	r *Reconciler
}

func newFixture(t *testing.T, spokes ...*hubtest.Spoke) *fixture {
	t.Helper()
	svc := &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svcName, UID: "hub"}}
	f := &fixture{Fleet: hubtest.NewFleet(t, []client.Object{svc}, spokes...)}
	f.r = &Reconciler{Hub: f.Hub.Client, Inv: f.Fleet, Recorder: f.Events, Opts: Options{TrustDomain: "fleetinfer.io", HubID: hubtest.HubID},
		CA: &ca.Authority{Client: f.Hub.Client, Reader: f.Hub.Reader, Secret: client.ObjectKey{Namespace: "fleetinfer-system", Name: "federation-ca"}}}
	return f
}

// reconcile runs one reconcile and returns the Events it recorded.
func (f *fixture) reconcile(t *testing.T) []string {
	t.Helper()
	req := mcreconcile.Request{Request: reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: svcName}}}
	if _, err := f.r.Reconcile(context.Background(), req); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	return f.Events.Drain()
}

// spokeWrites is every write the hub made to each spoke, nil for none.
func (f *fixture) spokeWrites() map[string][]string {
	out := map[string][]string{}
	for _, s := range f.Spokes() {
		out[s.Name] = s.Writes()
	}
	return out
}

// directory is what the hub published for the picker in cluster, one line
// per peer, or nil when there is no directory.
func (f *fixture) directory(t *testing.T, cluster string) []string {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if !f.Get(cluster, client.ObjectKey{Namespace: ns, Name: fleetv1alpha1.PeerDirectoryName(svcName)}, cm) {
		return nil
	}
	if !fleetv1alpha1.IsOwnedByHub(cm, hubtest.HubID) || cm.Labels[v1alpha2.LabelName] != svcName || len(cm.OwnerReferences) != 1 || !ownedByCopyOrImport(cm.OwnerReferences[0], cluster) {
		t.Errorf("%s: directory labels %v, owners %v; want the hub's, owned by the copy (or import)", cluster, cm.Labels, cm.OwnerReferences)
	}
	d, err := fleetv1alpha1.ParsePeerDirectory([]byte(cm.Data[fleetv1alpha1.PeerDirectoryKey]))
	if err != nil {
		t.Fatalf("%s: %v", cluster, err)
	}
	lines := []string{}
	for _, p := range d.Peers {
		if want := f.r.identity(p.Cluster, &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svcName}}); p.Identity != want {
			t.Errorf("%s lists %s as %s, want %s", cluster, p.Cluster, p.Identity, want)
		}
		line := strings.TrimSpace(fmt.Sprintf("%s %s %s %s", p.Cluster, p.FederationAddress, p.GatewayAddress, p.Mode))
		if p.SubscribeOnly {
			line += " subscribe-only"
		}
		lines = append(lines, line)
	}
	return lines
}

// certified reports whether cluster holds a certificate from the hub for its
// picker's identity.
func (f *fixture) certified(t *testing.T, cluster string) bool {
	t.Helper()
	s := &corev1.Secret{}
	if !f.Get(cluster, client.ObjectKey{Namespace: ns, Name: fleetv1alpha1.FederationTLSName(svcName)}, s) {
		return false
	}
	b, _ := pem.Decode(s.Data[corev1.TLSCertKey])
	if b == nil || !fleetv1alpha1.IsOwnedByHub(s, hubtest.HubID) || len(s.Data[corev1.ServiceAccountRootCAKey]) == 0 {
		t.Fatalf("%s: certificate Secret %v is not the hub's", cluster, s.Labels)
	}
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("spiffe://fleetinfer.io/cluster/%s/ns/%s/llminferenceservice/%s", cluster, ns, svcName)
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		t.Errorf("%s: certificate names %v, want %s", cluster, leaf.URIs, want)
	}
	return true
}

// check compares every cluster's directory with want; a cluster missing
// from want has neither directory nor certificate.
func (f *fixture) check(t *testing.T, want map[string][]string) {
	t.Helper()
	for _, s := range f.Spokes() {
		name := s.Name
		got, certified := f.directory(t, name), f.certified(t, name)
		w, member := want[name]
		switch {
		case !member && (got != nil || certified):
			t.Errorf("%s: directory %q, certificate %v; want neither", name, got, certified)
		case member && (!slices.Equal(got, w) || !certified):
			t.Errorf("%s: directory %q, certificate %v; want %q and a certificate", name, got, certified, w)
		}
	}
}

func hasEvent(events []string, parts ...string) bool {
	return slices.ContainsFunc(events, func(e string) bool {
		for _, p := range parts {
			if !strings.Contains(e, p) {
				return false
			}
		}
		return true
	})
}

// endpoint and parent are the modes the copies of directoryCases ask for.
const endpoint, parent = fleetv1alpha1.FederationEndpoint, fleetv1alpha1.FederationParent

// notOurs is a copy in central of a service of the same name the hub did
// not place.
func notOurs() *v1alpha2.LLMInferenceService {
	cp := copyOf("central", endpoint, reports("10.0.3.1:9004", ""))
	cp.Labels = nil
	return cp
}

// noFederation is a copy in central of a placement without federation.
func noFederation() *v1alpha2.LLMInferenceService {
	cp := copyOf("central", endpoint, reports("10.0.3.1:9004", ""))
	delete(cp.Annotations, fleetv1alpha1.FederationClusterAnnotation)
	return cp
}

// directoryCases are copies in east, west and central (in that order),
// and the directory each cluster should get.
var directoryCases = []struct {
	name   string
	copies []*v1alpha2.LLMInferenceService
	want   map[string][]string
	// events must each be recorded (every part of one Event).
	events [][]string
	// podNetworks overrides the clusters' shared pod network.
	podNetworks map[string]string
}{{
	name: "every copy reports its picker",
	copies: []*v1alpha2.LLMInferenceService{
		copyOf("east", endpoint, reports("10.0.1.1:9004", "")),
		copyOf("west", endpoint, reports("10.0.2.1:9004", "192.0.2.2:15080")),
		copyOf("central", endpoint, reports("[fd00::3]:9004", "")),
	},
	want: map[string][]string{
		"east":    {"central [fd00::3]:9004  Endpoint", "west 10.0.2.1:9004 192.0.2.2:15080 Endpoint"},
		"west":    {"central [fd00::3]:9004  Endpoint", "east 10.0.1.1:9004  Endpoint"},
		"central": {"east 10.0.1.1:9004  Endpoint", "west 10.0.2.1:9004 192.0.2.2:15080 Endpoint"},
	},
	events: [][]string{{"Normal", ReasonPeersUpdated, "east lists 2 peers: central, west"}},
}, {
	name: "a copy that reports no picker yet gets its directory and is in nobody's",
	copies: []*v1alpha2.LLMInferenceService{
		copyOf("east", endpoint, reports("10.0.1.1:9004", "")),
		copyOf("west", endpoint, reports("10.0.2.1:9004", "")),
		copyOf("central", endpoint, nil),
	},
	want: map[string][]string{
		"east":    {"west 10.0.2.1:9004  Endpoint"},
		"west":    {"east 10.0.1.1:9004  Endpoint"},
		"central": {"east 10.0.1.1:9004  Endpoint", "west 10.0.2.1:9004  Endpoint"},
	},
}, {
	name: "Parent mode leaves out a copy that reports no gateway address",
	copies: []*v1alpha2.LLMInferenceService{
		copyOf("east", parent, reports("10.0.1.1:9004", "192.0.2.1:15080")),
		copyOf("west", parent, reports("10.0.2.1:9004", "192.0.2.2:15080")),
		copyOf("central", parent, reports("10.0.3.1:9004", "")),
	},
	want: map[string][]string{
		"east":    {"west 10.0.2.1:9004 192.0.2.2:15080 Parent"},
		"west":    {"east 10.0.1.1:9004 192.0.2.1:15080 Parent"},
		"central": {"east 10.0.1.1:9004 192.0.2.1:15080 Parent", "west 10.0.2.1:9004 192.0.2.2:15080 Parent"},
	},
	events: [][]string{{"Warning", ReasonGatewayUnknown, "Cluster central", "its copy does not report"}},
}, {
	name: "Endpoint mode is used only between clusters that share a pod network, Parent mode between the others",
	copies: []*v1alpha2.LLMInferenceService{
		copyOf("east", endpoint, reports("10.0.1.1:9004", "192.0.2.1:15080")),
		copyOf("west", endpoint, reports("10.0.2.1:9004", "")),
		copyOf("central", endpoint, reports("10.0.3.1:9004", "192.0.2.3:15080")),
	},
	podNetworks: map[string]string{"east": "mesh", "west": "mesh", "central": ""},
	want: map[string][]string{
		"east":    {"central 10.0.3.1:9004 192.0.2.3:15080 Parent", "west 10.0.2.1:9004  Endpoint"},
		"west":    {"central 10.0.3.1:9004 192.0.2.3:15080 Parent", "east 10.0.1.1:9004 192.0.2.1:15080 Endpoint"},
		"central": {"east 10.0.1.1:9004 192.0.2.1:15080 Parent"},
	},
	events: [][]string{{"Warning", ReasonGatewayUnknown, "Cluster west", "Parent mode needs the address of its gateway"}},
}, {
	name: "different pod networks do not reach each other",
	copies: []*v1alpha2.LLMInferenceService{
		copyOf("east", endpoint, reports("10.0.1.1:9004", "192.0.2.1:15080")),
		copyOf("west", endpoint, reports("10.0.2.1:9004", "192.0.2.2:15080")),
	},
	podNetworks: map[string]string{"east": "mesh-a", "west": "mesh-b"},
	want: map[string][]string{
		"east": {"west 10.0.2.1:9004 192.0.2.2:15080 Parent"},
		"west": {"east 10.0.1.1:9004 192.0.2.1:15080 Parent"},
	},
}, {
	name: "an address that does not parse is left out",
	copies: []*v1alpha2.LLMInferenceService{
		copyOf("east", endpoint, reports("10.0.1.1:9004", "")),
		copyOf("west", endpoint, reports("10.0.2.1", "")),
	},
	want: map[string][]string{
		"east": {},
		"west": {"east 10.0.1.1:9004  Endpoint"},
	},
}, {
	name: "a copy without federation gets nothing and is in nobody's",
	copies: []*v1alpha2.LLMInferenceService{
		copyOf("east", endpoint, reports("10.0.1.1:9004", "")),
		copyOf("west", endpoint, reports("10.0.2.1:9004", "")),
		noFederation(),
	},
	want: map[string][]string{
		"east": {"west 10.0.2.1:9004  Endpoint"},
		"west": {"east 10.0.1.1:9004  Endpoint"},
	},
}, {
	name: "a service of the same name the hub did not place is no member",
	copies: []*v1alpha2.LLMInferenceService{
		copyOf("east", endpoint, reports("10.0.1.1:9004", "")),
		copyOf("west", endpoint, reports("10.0.2.1:9004", "")),
		notOurs(),
	},
	want: map[string][]string{
		"east": {"west 10.0.2.1:9004  Endpoint"},
		"west": {"east 10.0.1.1:9004  Endpoint"},
	},
}}

func TestDirectoriesListWhatTheOtherCopiesReport(t *testing.T) {
	for _, tc := range directoryCases {
		t.Run(tc.name, func(t *testing.T) {
			spokes := []*hubtest.Spoke{newSpoke("east"), newSpoke("west"), newSpoke("central")}
			for i, cp := range tc.copies {
				spokes[i] = newSpoke(spokes[i].Name, cp)
			}
			for _, s := range spokes {
				if n, ok := tc.podNetworks[s.Name]; ok {
					s.Labels[fleetv1alpha1.PodNetworkLabel] = n
				}
			}
			f := newFixture(t, spokes...)
			events := f.reconcile(t)
			f.check(t, tc.want)
			for _, e := range tc.events {
				if !hasEvent(events, e...) {
					t.Errorf("no Event with %q in %q", e, events)
				}
			}
		})
	}
}

// setCopy changes the copy in cluster through the API, as its spoke would:
// its object, then its status.
func (f *fixture) setCopy(t *testing.T, cluster string, change func(*v1alpha2.LLMInferenceService)) {
	t.Helper()
	api := f.Spoke(cluster).API
	cp := &v1alpha2.LLMInferenceService{}
	if err := api.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: svcName}, cp); err != nil {
		t.Fatal(err)
	}
	change(cp)
	status := cp.Status
	if err := api.Update(context.Background(), cp); err != nil {
		t.Fatal(err)
	}
	cp.Status = status
	if err := api.Status().Update(context.Background(), cp); err != nil {
		t.Fatal(err)
	}
}

func threeReporting(t *testing.T) *fixture {
	t.Helper()
	return newFixture(t,
		newSpoke("east", copyOf("east", fleetv1alpha1.FederationEndpoint, reports("10.0.1.1:9004", ""))),
		newSpoke("west", copyOf("west", fleetv1alpha1.FederationEndpoint, reports("10.0.2.1:9004", ""))),
		newSpoke("central", copyOf("central", fleetv1alpha1.FederationEndpoint, reports("10.0.3.1:9004", ""))))
}

func TestDirectoriesCarryTheRangesOfEachClustersRegistration(t *testing.T) {
	east := newSpoke("east", copyOf("east", fleetv1alpha1.FederationEndpoint, reports("10.1.0.5:9004", "")))
	west := newSpoke("west", copyOf("west", fleetv1alpha1.FederationEndpoint, reports("10.2.0.5:9004", "")))
	central := newSpoke("central", copyOf("central", fleetv1alpha1.FederationEndpoint, reports("10.3.0.5:9004", "")))
	for s, cidrs := range map[*hubtest.Spoke]string{east: "10.1.0.0/16, fd00:1::/64", west: "10.2.0.0/16", central: "not a range"} {
		s.Properties = map[string]string{fleetv1alpha1.PodCIDRsProperty: cidrs}
	}
	f := newFixture(t, east, west, central)
	f.reconcile(t)
	cm := &corev1.ConfigMap{}
	if err := east.API.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: fleetv1alpha1.PeerDirectoryName(svcName)}, cm); err != nil {
		t.Fatal(err)
	}
	d, err := fleetv1alpha1.ParsePeerDirectory([]byte(cm.Data[fleetv1alpha1.PeerDirectoryKey]))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.1.0.0/16", "fd00:1::/64"}; !slices.Equal(d.OwnEndpointCIDRs, want) {
		t.Errorf("east's own ranges %q, want %q", d.OwnEndpointCIDRs, want)
	}
	got := map[string][]string{}
	for _, p := range d.Peers {
		got[p.Cluster] = p.EndpointCIDRs
	}
	// central's property does not parse: its entry carries no ranges, and
	// pickers check only the address classes.
	if !slices.Equal(got["west"], []string{"10.2.0.0/16"}) || got["central"] != nil {
		t.Errorf("peer ranges in east's directory %q, want west's 10.2.0.0/16 and none for central", got)
	}
}

func TestAPickerMovingRewritesOnlyTheOtherDirectories(t *testing.T) {
	f := threeReporting(t)
	f.reconcile(t)
	f.ClearWrites()

	if events := f.reconcile(t); len(events) > 0 {
		t.Errorf("nothing changed, yet Events %q", events)
	}
	for name, w := range f.spokeWrites() {
		if len(w) > 0 {
			t.Errorf("nothing changed, yet %s got %q", name, w)
		}
	}

	f.setCopy(t, "east", func(cp *v1alpha2.LLMInferenceService) { cp.Status.Federation.PickerAddress = "10.0.1.9:9004" })
	f.ClearWrites()
	events := f.reconcile(t)
	f.check(t, map[string][]string{
		"east":    {"central 10.0.3.1:9004  Endpoint", "west 10.0.2.1:9004  Endpoint"},
		"west":    {"central 10.0.3.1:9004  Endpoint", "east 10.0.1.9:9004  Endpoint"},
		"central": {"east 10.0.1.9:9004  Endpoint", "west 10.0.2.1:9004  Endpoint"},
	})
	directory := "update ConfigMap " + ns + "/" + fleetv1alpha1.PeerDirectoryName(svcName)
	want := map[string][]string{"east": nil, "west": {directory}, "central": {directory}}
	for name, w := range f.spokeWrites() {
		if !slices.Equal(w, want[name]) {
			t.Errorf("%s got %q, want %q", name, w, want[name])
		}
	}
	if !hasEvent(events, ReasonPeersUpdated, "west") || !hasEvent(events, ReasonPeersUpdated, "central") || hasEvent(events, ReasonPeersUpdated, "cluster east") {
		t.Errorf("Events %q; want west's and central's directories updated, not east's", events)
	}
}

func TestACopyThatStopsFederatingLosesItsDirectoryAndCertificate(t *testing.T) {
	f := threeReporting(t)
	f.reconcile(t)

	// Stopping the service removes its picker.
	f.setCopy(t, "west", func(cp *v1alpha2.LLMInferenceService) { cp.Annotations[v1alpha2.StopAnnotation] = "true" })
	events := f.reconcile(t)
	f.check(t, map[string][]string{
		"east":    {"central 10.0.3.1:9004  Endpoint"},
		"central": {"east 10.0.1.1:9004  Endpoint"},
	})
	for _, kind := range []string{"directory", "certificate"} {
		if !hasEvent(events, "Normal", ReasonUnpublished, kind, "cluster west") {
			t.Errorf("no Event for west's %s in %q", kind, events)
		}
	}

	// So does a placement that turns federation off.
	f.setCopy(t, "central", func(cp *v1alpha2.LLMInferenceService) {
		delete(cp.Annotations, fleetv1alpha1.FederationClusterAnnotation)
	})
	f.reconcile(t)
	f.check(t, map[string][]string{"east": {}})

	// Once gone, nothing is left to remove.
	f.ClearWrites()
	f.reconcile(t)
	for name, w := range f.spokeWrites() {
		if len(w) > 0 {
			t.Errorf("%s got %q after everything was removed", name, w)
		}
	}
}

func TestAnObjectTheHubDidNotCreateIsLeftAloneAndReported(t *testing.T) {
	mine := func() *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fleetv1alpha1.PeerDirectoryName(svcName)},
			Data: map[string]string{fleetv1alpha1.PeerDirectoryKey: "peers: []\n"}}
	}
	f := newFixture(t,
		newSpoke("east", copyOf("east", fleetv1alpha1.FederationEndpoint, reports("10.0.1.1:9004", "")), mine()),
		newSpoke("west", copyOf("west", fleetv1alpha1.FederationEndpoint, reports("10.0.2.1:9004", ""))))
	unchanged := func() {
		t.Helper()
		cm := &corev1.ConfigMap{}
		if err := f.Spoke("east").API.Get(context.Background(), client.ObjectKeyFromObject(mine()), cm); err != nil {
			t.Fatalf("east's own ConfigMap: %v", err)
		}
		if fleetv1alpha1.IsOwnedByHub(cm, hubtest.HubID) || cm.Data[fleetv1alpha1.PeerDirectoryKey] != "peers: []\n" || len(cm.OwnerReferences) > 0 {
			t.Errorf("east's own ConfigMap was changed: %+v", cm)
		}
	}

	events := f.reconcile(t)
	unchanged()
	if !hasEvent(events, "Warning", ReasonNotOurs, "Cluster east", "ConfigMap "+ns+"/"+fleetv1alpha1.PeerDirectoryName(svcName)) {
		t.Errorf("no Event reports east's ConfigMap in %q", events)
	}
	if !f.certified(t, "east") || !slices.Equal(f.directory(t, "west"), []string{"east 10.0.1.1:9004  Endpoint"}) {
		t.Error("east's picker should still get its certificate and be listed in west's directory")
	}

	// Nor is it removed when east's copy stops federating.
	f.setCopy(t, "east", func(cp *v1alpha2.LLMInferenceService) { cp.Annotations[v1alpha2.StopAnnotation] = "true" })
	f.reconcile(t)
	unchanged()
	if f.certified(t, "east") {
		t.Error("east's certificate should be gone")
	}
}
