package export

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"
)

func TestAPoolExportedInOneClusterIsImportedIntoEveryAvailableCluster(t *testing.T) {
	withGatewayParent := exportedPool()
	withGatewayParent.Status.Parents = []igwapiv1.ParentStatus{{
		ParentRef:      igwapiv1.ParentReference{Kind: "Gateway", Name: "inference-gateway", Namespace: ns},
		ControllerName: "example.net/gateway",
		Conditions:     []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", LastTransitionTime: metav1.Unix(1, 0)}},
	}}
	deleting := exportedPool()
	deleting.Finalizers, deleting.DeletionTimestamp = []string{"example.net/hold"}, ptr.To(metav1.Unix(1, 0))
	otherValue := pool()
	otherValue.Annotations = map[string]string{igwapixv1alpha1.ExportAnnotationKey: "Local"}

	for _, tc := range []struct {
		name   string
		spokes []*spoke
		// importing is what each cluster's hub import lists; absent: no import.
		importing map[string][]string
		exported  []string // clusters whose pool carries the Exported parent
	}{{
		name:      "every member imports it listing the exporter, and the exporter's pool is Exported",
		spokes:    []*spoke{member("a"), member("b", exportedPool()), member("c")},
		importing: map[string][]string{"a": {"b"}, "b": {"b"}, "c": {"b"}},
		exported:  []string{"b"},
	}, {
		name:      "a cluster that holds the pool unexported imports it too",
		spokes:    []*spoke{member("a", exportedPool()), member("b", pool())},
		importing: map[string][]string{"a": {"a"}, "b": {"a"}},
		exported:  []string{"a"},
	}, {
		name:      "an unavailable member gets no import",
		spokes:    []*spoke{member("a", exportedPool()), unavailable("b"), member("c")},
		importing: map[string][]string{"a": {"a"}, "c": {"a"}},
		exported:  []string{"a"},
	}, {
		name:      "an unavailable exporter still counts but its pool is left as it is",
		spokes:    []*spoke{unavailable("a", exportedPool()), member("b")},
		importing: map[string][]string{"b": {"a"}},
	}, {
		name:   "a pool without the export annotation is not exported",
		spokes: []*spoke{member("a", pool()), member("b")},
	}, {
		name:   "a pool whose export annotation is not ClusterSet is not exported",
		spokes: []*spoke{member("a", otherValue), member("b")},
	}, {
		name:   "a pool being deleted is not exported",
		spokes: []*spoke{member("a", deleting), member("b")},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, tc.spokes...)
			f.reconcile()
			for _, s := range f.spokes {
				if got, want := f.exportingIn(s.name), tc.importing[s.name]; !slices.Equal(got, want) || (got == nil) != (want == nil) {
					t.Errorf("%s imports from %v, want %v (nil: no import)", s.name, got, want)
				}
				if got, want := f.exportedIn(s.name), slices.Contains(tc.exported, s.name); got != want {
					t.Errorf("%s: pool Exported = %v, want %v", s.name, got, want)
				}
			}
		})
	}

	t.Run("other controllers' parent entries on the pool stay", func(t *testing.T) {
		f := newFleet(t, member("a", withGatewayParent))
		f.reconcile()
		p := &igwapiv1.InferencePool{}
		f.get("a", poolKey, p)
		if len(p.Status.Parents) != 2 || !equality.Semantic.DeepEqual(p.Status.Parents[0], withGatewayParent.Status.Parents[0]) {
			t.Errorf("parents %+v, want the Gateway's entry unchanged and the hub's after it", p.Status.Parents)
		}
		if !f.exportedIn("a") {
			t.Error("the pool is not Exported")
		}
	})
}
