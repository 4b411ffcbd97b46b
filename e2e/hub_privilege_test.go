package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/distribute"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// hubID is the local fleet's hub's identity: its cluster's kube-system
// namespace's UID (hub/identity.go), as no --hub-id is set.
func hubID(t *testing.T) string {
	t.Helper()
	ks := &corev1.Namespace{}
	if err := fl.Hub.Client.Get(context.Background(), client.ObjectKey{Name: "kube-system"}, ks); err != nil {
		t.Fatal(err)
	}
	return string(ks.UID)
}

// The hub's real credential in a spoke, the kubeconfig the local fleet
// registered on the hub (deploy/hub/spoke-access's rights, in the hub
// group), cannot reach beyond what the hub writes, as an attacker holding
// it would try: a ServiceAccount-token Secret (the token controller would
// fill it in for the hub to read back), anything in kube-system, a
// namespace without a Pod Security level, an LLMInferenceService in a
// namespace of the spoke's own, or one whose pods would run under a
// ServiceAccount of the spoke or privileged, is refused by the spoke's API
// server with a message that says why. What the hub does write still
// passes.
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
	theirs := namespace(t, spoke) // the spoke's own, say its monitoring
	ns := hubsNamespace(t, spoke)
	hubs := map[string]string{fleetv1alpha1.ManagedByLabel: fleetv1alpha1.ManagedByHub}
	foreignSA := gpuService(ns, "foreign-sa", 1, 1)
	foreignSA.Spec.Template.ServiceAccountName = "default"
	privileged := gpuService(ns, "privileged", 1, 1)
	privileged.Spec.Template.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}

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
		{"an LLMInferenceService in an existing unlabelled namespace", theirs + " is neither", gpuService(theirs, "escalate", 1, 1)},
		{"a Secret in an existing unlabelled namespace", theirs + " is neither", &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: theirs, Name: "hubs", Labels: hubs}}},
		{"an LLMInferenceService naming a foreign ServiceAccount", "ServiceAccount other than the service's own", foreignSA},
		{"a privileged LLMInferenceService", "may not run privileged containers", privileged},
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
		gpuService(ns, "plain", 1, 1),
	}
	for _, o := range allowed {
		if err := asHub.Create(ctx, o); err != nil {
			t.Errorf("the hub's credential could not create %T %s it writes: %v", o, o.GetName(), err)
			continue
		}
		_ = spoke.Client.Delete(ctx, o)
	}
}

// hubsNamespace is a new spoke namespace labelled as one a hub created.
func hubsNamespace(t *testing.T, spoke *fleet.Cluster) string {
	t.Helper()
	name := testutil.NewLabelledNamespace(t, spoke.Client, fleetv1alpha1.HubNamespaceLabels("e2e"))
	removeNamespaceOnCleanup(t, name, spoke)
	return name
}

// A hub tenant namespace whose name east already uses for its own is a
// Conflict there: the hub service says which label lets the hub in, the
// hub writes nothing into east's namespace, and the service runs in the
// other clusters.
func TestAHubNamespaceThatIsASpokesOwnIsAConflict(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, fl.Hub)
	east := fl.Spoke("east")
	if err := east.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"team": "monitoring"}}}); err != nil {
		t.Fatal(err)
	}
	removeNamespaceOnCleanup(t, ns, east)
	began := time.Now()
	place(t, gpuService(ns, "collides", 1, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east", "west"}}})
	optIn := fleetv1alpha1.AcceptsHubLabel + "=" + hubID(t)
	testutil.Eventually(t, 90*time.Second, "conflict reported and west running", func(ctx context.Context) error {
		svc := &v1alpha2.LLMInferenceService{}
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "collides"}, svc); err != nil {
			return err
		}
		c := svc.Status.GetCondition(distribute.Distributed)
		if c == nil || c.Reason != distribute.ReasonNamespaceNotOurs || !strings.Contains(c.Message, "east") || !strings.Contains(c.Message, optIn) {
			return fmt.Errorf("%s", hubConditions(svc))
		}
		for _, e := range svc.Status.Clusters {
			if e.Name == "west" && e.Phase != distribute.PhaseRunning {
				return fmt.Errorf("west is %s: %s", e.Phase, e.Message)
			}
		}
		t.Logf("Distributed=%s/%s: %s", c.Status, c.Reason, c.Message)
		return nil
	})
	got, err := copies(ctx, ns, "collides")
	if err != nil || got["west"] != 1 || got["east"] != 0 {
		t.Errorf("copies %v (%v); want west's only", got, err)
	}
	forEachHubWrite(t, began, func(cluster, verb, uri string, _ time.Time) {
		if cluster == "east" && strings.Contains(uri, "/namespaces/"+ns+"/") {
			t.Errorf("the hub wrote into east's own namespace: %s %s", verb, uri)
		}
	})
	n := &corev1.Namespace{}
	if err := east.Client.Get(ctx, client.ObjectKey{Name: ns}, n); err != nil || len(n.Labels) != 2 {
		t.Errorf("east's namespace is now labelled %v (%v); want it as it was", n.Labels, err)
	}
}
