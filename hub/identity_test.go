package hub

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestHubIdentity(t *testing.T) {
	kubeSystem := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: "5c6f8d2e-hub-cluster"}}
	for _, tc := range []struct {
		name    string
		objs    []client.Object
		given   string
		want    string
		wantErr string
	}{
		{name: "derived from the hub cluster's kube-system namespace", objs: []client.Object{kubeSystem}, want: "5c6f8d2e-hub-cluster"},
		{name: "given wins, as for a restore taking over", objs: []client.Object{kubeSystem}, given: "prod-hub", want: "prod-hub"},
		{name: "given must be a label value", given: "prod hub/1", wantErr: "not a valid label value"},
		{name: "nothing to derive from", wantErr: "set --hub-id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithObjects(tc.objs...).Build()
			got, err := HubIdentity(context.Background(), c, tc.given)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("HubIdentity = %q, %v; want an error saying %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("HubIdentity = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// Two hub installations given the same --hub-id (a restored hub beside the
// one it replaces) hold the spokes' leases under different names, while the
// replicas of one installation share it; another namespace of the same
// cluster is another installation.
func TestHubInstallation(t *testing.T) {
	cluster := func(uid string) client.Reader {
		return fake.NewClientBuilder().WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: types.UID(uid)}}).Build()
	}
	ctx := context.Background()
	names := map[string]bool{}
	for _, hub := range []struct{ uid, namespace string }{{"uid-a", "fleetinfer-system"}, {"uid-b", "fleetinfer-system"}, {"uid-a", "fleetinfer-dr"}} {
		got, err := HubInstallation(ctx, cluster(hub.uid), hub.namespace)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := HubInstallation(ctx, cluster(hub.uid), hub.namespace)
		if names[got] || got != again {
			t.Errorf("HubInstallation(%s, %s) = %q (again %q), seen before: %v", hub.uid, hub.namespace, got, again, names)
		}
		names[got] = true
	}
	if _, err := HubInstallation(ctx, fake.NewClientBuilder().Build(), "fleetinfer-system"); err == nil {
		t.Error("no kube-system: want an error")
	}
}
