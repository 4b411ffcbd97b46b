package fleet

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterv1beta1 "open-cluster-management.io/api/cluster/v1beta1"
	clusterinventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	inferencexv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	servingv1alpha2 "github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// Scheme knows every API the fleet's clients read and write.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(clusterv1.Install(Scheme))
	utilruntime.Must(clusterv1beta1.Install(Scheme))
	utilruntime.Must(clusterinventoryv1alpha1.AddToScheme(Scheme))
	utilruntime.Must(gatewayv1.Install(Scheme))
	utilruntime.Must(inferencev1.Install(Scheme))
	utilruntime.Must(inferencexv1alpha1.Install(Scheme))
	utilruntime.Must(lwsv1.AddToScheme(Scheme))
	utilruntime.Must(servingv1alpha2.AddToScheme(Scheme))
	utilruntime.Must(fleetv1alpha1.AddToScheme(Scheme))
}
