package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// The hub's real credential in a spoke, the kubeconfig the local fleet
// registered on the hub (deploy/hub/spoke-access's rights, in the hub
// group), cannot reach beyond what the hub writes: a ServiceAccount-token
// Secret (the token controller would fill it in for the hub to read back),
// anything in kube-system, or a namespace without a Pod Security level is
// refused by the spoke's API server. What the hub does write still passes.
func TestHubCredentialInASpokeCannotEscalate(t *testing.T) {
	ctx := context.Background()
	spoke := fl.Spokes[0]
	reg := &corev1.Secret{}
	if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: fleet.Namespace, Name: spoke.Name()}, reg); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(reg.Data[fleet.KubeconfigSecretKey])
	if err != nil {
		t.Fatal(err)
	}
	asHub, err := client.New(cfg, client.Options{Scheme: fleet.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := namespace(t, spoke)
	hubs := map[string]string{fleetv1alpha1.ManagedByLabel: fleetv1alpha1.ManagedByHub}

	denied := []struct {
		what, want string
		obj        client.Object
	}{
		{"a ServiceAccount-token Secret", "Opaque or kubernetes.io/tls", &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "token", Labels: hubs,
				Annotations: map[string]string{corev1.ServiceAccountNameKey: "default"}},
			Type: corev1.SecretTypeServiceAccountToken}},
		{"a Secret in kube-system", "system namespace kube-system", &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "hubs", Labels: hubs}}},
		{"an LLMInferenceService in kube-system", "system namespace kube-system", gpuService("kube-system", "escalate", 1, 1)},
		{"a namespace without a Pod Security level", "pod-security.kubernetes.io/enforce", &corev1.Namespace{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-open", Labels: hubs}}},
	}
	for _, d := range denied {
		err := asHub.Create(ctx, d.obj)
		if err == nil {
			_ = spoke.Client.Delete(ctx, d.obj)
		}
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), d.want) {
			t.Errorf("the hub's credential could create %s: %v", d.what, err)
		} else {
			t.Logf("%s: refused: %v", d.what, err)
		}
	}

	allowed := []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hubs", Labels: hubs}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: nil, corev1.TLSPrivateKeyKey: nil}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns + "-hubs", Labels: fleetv1alpha1.HubNamespaceLabels("e2e")}},
	}
	for _, o := range allowed {
		if err := asHub.Create(ctx, o); err != nil {
			t.Errorf("the hub's credential could not create %T %s it writes: %v", o, o.GetName(), err)
			continue
		}
		_ = spoke.Client.Delete(ctx, o)
	}
}
