package fleet

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
)

// HubName is the hub cluster's name in every fleet.
const HubName = "hub"

// BindEveryCluster gives hub namespace ns the whole fleet: a
// ClusterSetBinding of the global set, as a platform team gives a namespace
// it trusts. The hub places nothing from a namespace without a binding.
func BindEveryCluster(ctx context.Context, hub client.Client, ns string) error {
	b := &fleetv1alpha1.ClusterSetBinding{ObjectMeta: metav1.ObjectMeta{Name: fleetv1alpha1.GlobalClusterSet, Namespace: ns},
		Spec: fleetv1alpha1.ClusterSetBindingSpec{ClusterSet: fleetv1alpha1.GlobalClusterSet}}
	return client.IgnoreAlreadyExists(hub.Create(ctx, b))
}
