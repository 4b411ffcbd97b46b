package export

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
)

// exportCase is a fleet, and what each of its clusters should import and
// export once the hub reconciled the pool.
type exportCase struct {
	name   string
	spokes []*hubtest.Spoke
	// importing is what each cluster's hub import lists; absent: no import.
	importing map[string][]string
	exported  []string // clusters whose pool carries the Exported parent
}

// exportCases are made anew for each use, as a fleet starts its spokes.
func exportCases() []exportCase {
	deleting := exportedPool()
	deleting.Finalizers, deleting.DeletionTimestamp = []string{"example.net/hold"}, ptr.To(metav1.Unix(1, 0))
	otherValue := pool()
	otherValue.Annotations = map[string]string{igwapixv1alpha1.ExportAnnotationKey: "Local"}
	otherHubs := placedCopy()
	fleetv1alpha1.MarkOwnedByHub(otherHubs, "another-hub")
	recreated := placedCopy()
	recreated.UID = "uid-of-a-new-copy"

	return []exportCase{{
		name:      "every member imports it listing the exporter, and the exporter's pool is Exported",
		spokes:    []*hubtest.Spoke{member("a"), member("b", exportedPool()), member("c")},
		importing: map[string][]string{"a": {"b"}, "b": {"b"}, "c": {"b"}},
		exported:  []string{"b"},
	}, {
		name:      "a cluster that holds the pool unexported imports it too",
		spokes:    []*hubtest.Spoke{member("a", exportedPool()), member("b", pool())},
		importing: map[string][]string{"a": {"a"}, "b": {"a"}},
		exported:  []string{"a"},
	}, {
		name:      "an unavailable member gets no import",
		spokes:    []*hubtest.Spoke{member("a", exportedPool()), unavailable("b"), member("c")},
		importing: map[string][]string{"a": {"a"}, "c": {"a"}},
		exported:  []string{"a"},
	}, {
		name:      "an unavailable exporter still counts but its pool is left as it is",
		spokes:    []*hubtest.Spoke{unavailable("a", exportedPool()), member("b")},
		importing: map[string][]string{"b": {"a"}},
	}, {
		name:   "a pool without the export annotation is not exported",
		spokes: []*hubtest.Spoke{member("a", pool()), member("b")},
	}, {
		name:   "a pool whose export annotation is not ClusterSet is not exported",
		spokes: []*hubtest.Spoke{member("a", otherValue), member("b")},
	}, {
		name:   "a pool being deleted is not exported",
		spokes: []*hubtest.Spoke{member("a", deleting), member("b")},
	}, {
		name:   "a pool of the spoke's own service is not exported",
		spokes: []*hubtest.Spoke{member("a", foreignExportedPool()), member("b")},
	}, {
		name:   "a pool of another hub's copy is not exported",
		spokes: []*hubtest.Spoke{hubtest.NewSpoke("a", exportedPool(), otherHubs), member("b")},
	}, {
		name:   "a pool whose owner is another object of the copy's name is not exported",
		spokes: []*hubtest.Spoke{hubtest.NewSpoke("a", exportedPool(), recreated), member("b")},
	}}
}

func TestAPoolExportedInOneClusterIsImportedIntoEveryAvailableCluster(t *testing.T) {
	withGatewayParent := exportedPool()
	withGatewayParent.Status.Parents = []igwapiv1.ParentStatus{{
		ParentRef:      igwapiv1.ParentReference{Kind: "Gateway", Name: "inference-gateway", Namespace: ns},
		ControllerName: "example.net/gateway",
		Conditions:     []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", LastTransitionTime: metav1.Unix(1, 0)}},
	}}
	for _, tc := range exportCases() {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, tc.spokes...)
			f.reconcile()
			for _, s := range f.Spokes() {
				if got, want := f.exportingIn(s.Name), tc.importing[s.Name]; !slices.Equal(got, want) || (got == nil) != (want == nil) {
					t.Errorf("%s imports from %v, want %v (nil: no import)", s.Name, got, want)
				}
				if got, want := f.exportedIn(s.Name), slices.Contains(tc.exported, s.Name); got != want {
					t.Errorf("%s: pool Exported = %v, want %v", s.Name, got, want)
				}
			}
		})
	}

	t.Run("other controllers' parent entries on the pool stay", func(t *testing.T) {
		f := newFleet(t, member("a", withGatewayParent))
		f.reconcile()
		p := &igwapiv1.InferencePool{}
		f.Get("a", poolKey, p)
		if len(p.Status.Parents) != 2 || !equality.Semantic.DeepEqual(p.Status.Parents[0], withGatewayParent.Status.Parents[0]) {
			t.Errorf("parents %+v, want the Gateway's entry unchanged and the hub's after it", p.Status.Parents)
		}
		if !f.exportedIn("a") {
			t.Error("the pool is not Exported")
		}
	})
}

// stopsExporting are the ways a cluster stops exporting the pool.
var stopsExporting = []struct {
	name string
	stop func(t *testing.T, c client.Client)
}{{
	name: "annotation removed",
	stop: func(t *testing.T, c client.Client) {
		p := &igwapiv1.InferencePool{}
		if err := c.Get(t.Context(), poolKey, p); err != nil {
			t.Fatal(err)
		}
		delete(p.Annotations, igwapixv1alpha1.ExportAnnotationKey)
		if err := c.Update(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	},
}, {
	name: "pool deleted",
	stop: func(t *testing.T, c client.Client) {
		if err := c.Delete(t.Context(), pool()); err != nil {
			t.Fatal(err)
		}
	},
}, {
	name: "pool being deleted",
	stop: func(t *testing.T, c client.Client) {
		p := &igwapiv1.InferencePool{}
		if err := c.Get(t.Context(), poolKey, p); err != nil {
			t.Fatal(err)
		}
		p.Finalizers = append(p.Finalizers, "example.net/hold")
		if err := c.Update(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	},
}}

func TestTheImportFollowsTheClustersThatExport(t *testing.T) {
	ctx := context.Background()
	for _, tc := range stopsExporting {
		t.Run(tc.name, func(t *testing.T) {
			own := ownImport(nil)
			f := newFleet(t, member("a", exportedPool()), member("b", exportedPool()), member("c", own), member("d"))
			expect := func(step string, importing []string) {
				t.Helper()
				for _, cl := range []string{"a", "b", "d"} {
					if got := f.exportingIn(cl); !slices.Equal(got, importing) || (got == nil) != (importing == nil) {
						t.Errorf("%s: %s imports from %v, want %v (nil: no import)", step, cl, got, importing)
					}
				}
				n, ok := exportedGauge(t)
				if want := float64(len(importing)); ok != (importing != nil) || n != want {
					t.Errorf("%s: gauge %v (present %v), want %v (present %v)", step, n, ok, want, importing != nil)
				}
				got := &igwapixv1alpha1.InferencePoolImport{}
				if !f.Get("c", poolKey, got) || got.ResourceVersion != "999" || !equality.Semantic.DeepEqual(got.Status, own.Status) || len(got.Labels) != 0 {
					t.Errorf("%s: the spoke's own import is now %+v, want it as it was", step, got)
				}
			}

			f.reconcile()
			expect("both export", []string{"a", "b"})

			// A Gateway controller in d reports on the import; that stays.
			imp := &igwapixv1alpha1.InferencePoolImport{}
			f.Get("d", poolKey, imp)
			accepted := []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", LastTransitionTime: metav1.Unix(1, 0)}}
			imp.Status.Controllers[0].Conditions = accepted
			gateway := igwapixv1alpha1.ImportController{Name: "example.net/gateway", Conditions: accepted}
			imp.Status.Controllers = append(imp.Status.Controllers, gateway)
			if err := f.Spoke("d").API.Status().Update(ctx, imp); err != nil {
				t.Fatal(err)
			}

			tc.stop(t, f.Spoke("a").API)
			f.reconcile()
			expect("a stopped", []string{"b"})
			f.Get("d", poolKey, imp)
			if len(imp.Status.Controllers) != 2 || !equality.Semantic.DeepEqual(imp.Status.Controllers[0].Conditions, accepted) ||
				!equality.Semantic.DeepEqual(imp.Status.Controllers[1], gateway) {
				t.Errorf("d's import controllers %+v, want the hub's conditions and the Gateway's entry kept", imp.Status.Controllers)
			}

			tc.stop(t, f.Spoke("b").API)
			f.reconcile()
			expect("none exports", nil)
		})
	}
}

func TestASpokesOwnImportIsNeverChangedOrDeleted(t *testing.T) {
	for _, tc := range []struct {
		name     string
		labels   map[string]string
		exported bool
	}{
		{name: "unlabelled, while another cluster exports the pool", exported: true},
		{name: "unlabelled, when no cluster exports the pool"},
		{name: "managed by someone else, while another cluster exports the pool", labels: map[string]string{fleetv1alpha1.ManagedByLabel: "someone-else"}, exported: true},
		{name: "managed by someone else, when no cluster exports the pool", labels: map[string]string{fleetv1alpha1.ManagedByLabel: "someone-else"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			own := ownImport(tc.labels)
			p := pool()
			if tc.exported {
				p = exportedPool()
			}
			f := newFleet(t, member("a", p), member("b", own))
			f.reconcile()
			got := &igwapixv1alpha1.InferencePoolImport{}
			// The fake client gives objects it starts with resourceVersion 999.
			if !f.Get("b", poolKey, got) {
				t.Fatal("the spoke's own import was deleted")
			}
			if got.ResourceVersion != "999" || !equality.Semantic.DeepEqual(got.Labels, own.Labels) || !equality.Semantic.DeepEqual(got.Status, own.Status) {
				t.Errorf("the spoke's own import is now %+v, want it as it was", got)
			}
			if w := f.Writes()["b"]; len(w) > 0 {
				t.Errorf("the hub wrote to b: %v", w)
			}
			if want := tc.exported; f.exportingIn("a") != nil != want {
				t.Errorf("a imports from %v; want an import: %v", f.exportingIn("a"), want)
			}
		})
	}
}

// A member without the namespace gets it, as the hub's; a member whose
// namespace opts in to this hub gets the import there; one whose namespace
// is its own, not opted in, gets nothing.
func TestTheNamespaceIsCreatedWhereItIsMissing(t *testing.T) {
	optedIn := map[string]string{"team": "llama", fleetv1alpha1.AcceptsHubLabel: hubtest.HubID}
	for _, tc := range []struct {
		name    string
		spokes  []*hubtest.Spoke
		want    map[string]map[string]string // each cluster's namespace labels afterwards
		imports map[string]bool              // whether the cluster imports
	}{{
		name:    "a member without the namespace gets it, labelled as the hub's, with its Pod Security level",
		spokes:  []*hubtest.Spoke{member("a", exportedPool(), hubtest.Namespace(ns, optedIn)), member("b")},
		want:    map[string]map[string]string{"a": optedIn, "b": fleetv1alpha1.HubNamespaceLabels(hubtest.HubID)},
		imports: map[string]bool{"a": true, "b": true},
	}, {
		name:    "a namespace of the member's own stays as it is, without an import",
		spokes:  []*hubtest.Spoke{member("a", exportedPool(), hubtest.Namespace(ns, optedIn)), member("b", hubtest.Namespace(ns, nil))},
		want:    map[string]map[string]string{"a": optedIn, "b": nil},
		imports: map[string]bool{"a": true, "b": false},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, tc.spokes...)
			f.reconcile()
			for cl, want := range tc.want {
				n := hubtest.Namespace(ns, nil)
				if !f.Get(cl, client.ObjectKey{Name: ns}, n) {
					t.Errorf("%s has no namespace %s", cl, ns)
					continue
				}
				if !maps.Equal(n.Labels, want) {
					t.Errorf("%s: namespace labels %v, want %v", cl, n.Labels, want)
				}
				if got := f.exportingIn(cl); slices.Equal(got, []string{"a"}) != tc.imports[cl] {
					t.Errorf("%s imports from %v, want an import: %v", cl, got, tc.imports[cl])
				}
			}
		})
	}
}

func TestASecondReconcileWithNothingChangedWritesNothing(t *testing.T) {
	withGatewayParent := exportedPool()
	withGatewayParent.Status.Parents = []igwapiv1.ParentStatus{{
		ParentRef:      igwapiv1.ParentReference{Kind: "Gateway", Name: "inference-gateway", Namespace: ns},
		ControllerName: "example.net/gateway",
	}}
	leftover := ownImport(fleetv1alpha1.OwnedByHubLabels(hubtest.HubID))
	for _, tc := range []struct {
		name   string
		spokes []*hubtest.Spoke
	}{
		{name: "one exporter", spokes: []*hubtest.Spoke{member("a", exportedPool()), member("b"), member("c")}},
		{name: "two exporters and a spoke's own import", spokes: []*hubtest.Spoke{member("a", exportedPool()), member("b", exportedPool()), member("c", ownImport(nil))}},
		{name: "an exporter whose pool has a Gateway parent", spokes: []*hubtest.Spoke{member("a", withGatewayParent), member("b")}},
		{name: "an unavailable exporter", spokes: []*hubtest.Spoke{unavailable("a", exportedPool()), member("b")}},
		{name: "no exporter any more, a hub import left", spokes: []*hubtest.Spoke{member("a", pool()), member("b", leftover)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, tc.spokes...)
			f.reconcile()
			if len(f.Writes()) == 0 {
				t.Fatal("the first reconcile wrote nothing; the case tests nothing")
			}
			f.ClearWrites()
			f.reconcile()
			if w := f.Writes(); len(w) > 0 {
				t.Errorf("the second reconcile wrote %v", w)
			}
		})
	}
}

func TestAnExporterWhosePoolCannotBeReadStaysImported(t *testing.T) {
	for _, tc := range []struct {
		name      string
		exporters []string // clusters exporting the pool; "a" later cannot be read
		want      []string // what every import lists while a cannot be read
	}{
		{name: "the only exporter", exporters: []string{"a"}, want: []string{"a"}},
		{name: "one of two exporters", exporters: []string{"a", "b"}, want: []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var spokes []*hubtest.Spoke
			for _, n := range []string{"a", "b", "c"} {
				s := member(n)
				if slices.Contains(tc.exporters, n) {
					s.Objects = append(s.Objects, exportedPool(), placedCopy())
				}
				spokes = append(spokes, s)
			}
			f := newFleet(t, spokes...)
			f.reconcile()
			f.Spoke("a").Inject(unreadablePools)
			f.ClearWrites()
			if _, err := f.r.Reconcile(context.Background(), watch.Request(ns, poolName)); err == nil {
				t.Error("a failed read was not returned for a retry")
			}
			for _, n := range []string{"a", "b", "c"} {
				if got := f.exportingIn(n); !slices.Equal(got, tc.want) {
					t.Errorf("import in %s lists %v, want %v", n, got, tc.want)
				}
			}
			for n, w := range f.Writes() {
				for _, op := range w {
					if strings.HasPrefix(op, "delete") {
						t.Errorf("cluster %s: %s while a's pool could not be read", n, op)
					}
				}
			}
		})
	}
}
