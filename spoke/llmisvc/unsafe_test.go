package llmisvc_test

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/spoke/llmisvc"
)

// A hub's copy that would run its pods under a foreign ServiceAccount or
// privileged, itself or through a config the hub wrote, is not rendered:
// PresetsCombined=False/UnsafePodSpec names what, and no workload exists.
// The spoke's own service asking the same is its admin's to allow.
func TestAHubCopyWithUnsafePodsIsNotRendered(t *testing.T) {
	ctx := context.Background()
	ns := testutil.NewNamespace(t, c)
	hubs := fleetv1alpha1.OwnedByHubLabels("hub-a")
	withTemplate := func(name string, labels map[string]string, p corev1.PodSpec) *v1alpha2.LLMInferenceService {
		return &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec: v1alpha2.LLMInferenceServiceSpec{Model: v1alpha2.LLMModelSpec{URI: "hf://facebook/opt-125m"},
				WorkloadSpec: v1alpha2.WorkloadSpec{Template: &p}}}
	}
	main := corev1.Container{Name: "main", Image: "vllm/vllm-openai:v0.11.0"}
	privileged := main
	privileged.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}

	cfg := &v1alpha2.LLMInferenceServiceConfig{ObjectMeta: metav1.ObjectMeta{Name: "host-network", Namespace: ns, Labels: hubs},
		Spec: v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Template: &corev1.PodSpec{HostNetwork: true}}}}
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	viaConfig := withTemplate("via-config", hubs, corev1.PodSpec{Containers: []corev1.Container{main}})
	viaConfig.Spec.BaseRefs = []corev1.LocalObjectReference{{Name: cfg.Name}}
	for _, tc := range []struct {
		svc  *v1alpha2.LLMInferenceService
		want string
	}{
		{withTemplate("foreign-sa", hubs, corev1.PodSpec{ServiceAccountName: "argocd-server", Containers: []corev1.Container{main}}),
			"spec.template: ServiceAccount argocd-server is not the service's own"},
		{withTemplate("privileged", hubs, corev1.PodSpec{Containers: []corev1.Container{privileged}}), "container main: privileged"},
		{viaConfig, "host namespaces"},
	} {
		if err := c.Create(ctx, tc.svc); err != nil {
			t.Fatal(err)
		}
		got := condition(t, client.ObjectKeyFromObject(tc.svc), v1alpha2.PresetsCombined, corev1.ConditionFalse, llmisvc.ReasonUnsafePodSpec)
		if msg := got.Status.GetCondition(v1alpha2.PresetsCombined).Message; !strings.Contains(msg, tc.want) {
			t.Errorf("%s: PresetsCombined says %q; want it to name %q", tc.svc.Name, msg, tc.want)
		}
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: tc.svc.Name + "-kserve"}, &appsv1.Deployment{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s: its Deployment: %v; want none", tc.svc.Name, err)
		}
	}

	own := withTemplate("spokes-own", nil, corev1.PodSpec{Containers: []corev1.Container{privileged}})
	if err := c.Create(ctx, own); err != nil {
		t.Fatal(err)
	}
	condition(t, client.ObjectKeyFromObject(own), v1alpha2.PresetsCombined, corev1.ConditionTrue, "")
}
