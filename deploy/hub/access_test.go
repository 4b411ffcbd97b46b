package hub_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/deploy/charts"
	deployhub "github.com/fleetinfer/fleetinfer/deploy/hub"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/internal/testutil/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithFleetCRDs(m, &env, []func(*runtime.Scheme) error{v1alpha2.AddToScheme}, grantSpokeAccess))
}

// grantSpokeAccess applies spoke-access as a spoke's admin does.
func grantSpokeAccess(ctx context.Context, e *testenv.Env) error {
	objs, err := charts.ParseManifests(deployhub.SpokeAccess)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := e.Client.Patch(ctx, o, client.Apply, client.FieldOwner("test"), client.ForceOwnership); err != nil {
			return fmt.Errorf("apply %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}

// asHub is a client acting as the hub's ServiceAccount in the spoke.
func asHub(t *testing.T) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + fleetv1alpha1.HubServiceAccountNamespace + ":fleetinfer-hub",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + fleetv1alpha1.HubServiceAccountNamespace, "system:authenticated"},
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func service(ns string, change func(*v1alpha2.LLMInferenceServiceSpec)) *v1alpha2.LLMInferenceService {
	svc := &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llama"},
		Spec: v1alpha2.LLMInferenceServiceSpec{Model: v1alpha2.LLMModelSpec{URI: "hf://facebook/opt-125m"},
			WorkloadSpec: v1alpha2.WorkloadSpec{Template: &corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "vllm"}}}}}}
	if change != nil {
		change(&svc.Spec)
	}
	return svc
}

// eventuallyRefused waits for the policy to be loaded: the API server
// reads policies and bindings through informers.
func eventuallyRefused(t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "the admission policy loaded", func(ctx context.Context) error {
		if err := c.Create(ctx, obj.DeepCopyObject().(client.Object), client.DryRunAll); !apierrors.IsForbidden(err) {
			return fmt.Errorf("not refused yet: %v", err)
		}
		return nil
	})
}

// The hub writes only in namespaces a hub created or that opt in to one,
// whatever it writes there.
func TestTheHubWritesOnlyInItsOwnOrOptedInNamespaces(t *testing.T) {
	c := asHub(t)
	theirs := testutil.NewLabelledNamespace(t, env.Client, map[string]string{"team": "monitoring"})
	eventuallyRefused(t, c, service(theirs, nil))
	for _, tc := range []struct {
		name   string
		labels map[string]string
		allow  bool
	}{
		{"created by a hub", fleetv1alpha1.HubNamespaceLabels("hub-a"), true},
		{"opted in", map[string]string{fleetv1alpha1.AcceptsHubLabel: "hub-a"}, true},
		{"the spoke's own", map[string]string{"team": "monitoring"}, false},
		{"managed-by without a hub ID", fleetv1alpha1.ManagedByHubLabels(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testutil.NewLabelledNamespace(t, env.Client, tc.labels)
			hubs := fleetv1alpha1.OwnedByHubLabels("hub-a")
			for _, o := range []client.Object{
				service(ns, nil),
				&v1alpha2.LLMInferenceServiceConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cfg"}},
				&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "peers", Labels: hubs}},
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tls", Labels: hubs}},
			} {
				err := c.Create(t.Context(), o, client.DryRunAll)
				if tc.allow && err != nil {
					t.Errorf("%T refused: %v", o, err)
				}
				if !tc.allow && (!apierrors.IsForbidden(err) || !strings.Contains(err.Error(), fleetv1alpha1.AcceptsHubLabel)) {
					t.Errorf("%T: %v; want it refused naming %s", o, err, fleetv1alpha1.AcceptsHubLabel)
				}
			}
		})
	}
	created := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "created-", Labels: fleetv1alpha1.HubNamespaceLabels("hub-a")}}
	if err := c.Create(t.Context(), created, client.DryRunAll); err != nil {
		t.Errorf("the hub could not create a namespace of its own: %v", err)
	}
}

// The admission policy and LLMInferenceServiceSpec.UnsafePods, which the
// spoke controller applies to hub copies, agree on every pod spec below:
// the hub's credential can write no copy the spoke would refuse, and the
// spoke refuses what a policy missing from a cluster would let through.
func TestThePolicyAndTheSpokeAgreeOnUnsafePods(t *testing.T) {
	c := asHub(t)
	ns := testutil.NewLabelledNamespace(t, env.Client, fleetv1alpha1.HubNamespaceLabels("hub-a"))
	privileged := func(s *v1alpha2.LLMInferenceServiceSpec) {
		s.Template.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	}
	eventuallyRefused(t, c, service(ns, privileged))
	pipeline := &v1alpha2.ParallelismSpec{Pipeline: ptr.To[int32](2)}
	worker := func(p corev1.PodSpec) func(*v1alpha2.LLMInferenceServiceSpec) {
		return func(s *v1alpha2.LLMInferenceServiceSpec) { s.Worker, s.Parallelism = &p, pipeline }
	}
	container := func(sc *corev1.SecurityContext, ports ...corev1.ContainerPort) corev1.PodSpec {
		return corev1.PodSpec{Containers: []corev1.Container{{Name: "w", Image: "vllm", SecurityContext: sc, Ports: ports}}}
	}
	scheduler := func(sa string) func(*v1alpha2.LLMInferenceServiceSpec) {
		return func(s *v1alpha2.LLMInferenceServiceSpec) {
			s.Router = &v1alpha2.RouterSpec{Scheduler: &v1alpha2.SchedulerSpec{Template: &corev1.PodSpec{ServiceAccountName: sa,
				Containers: []corev1.Container{{Name: "epp", Image: "epp"}}}}}
		}
	}
	caps := func(add ...corev1.Capability) *corev1.SecurityContext {
		return &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: add, Drop: []corev1.Capability{"ALL"}}}
	}
	for _, tc := range []struct {
		name   string
		change func(*v1alpha2.LLMInferenceServiceSpec)
		safe   bool
	}{
		{"a plain pod", nil, true},
		{"the presets' hardening", worker(container(&corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
			RunAsNonRoot: ptr.To(true), Privileged: ptr.To(false)})), true},
		{"baseline capabilities", worker(container(caps("NET_BIND_SERVICE", "CHOWN"))), true},
		{"the picker under its own ServiceAccount", scheduler("llama-epp-sa"), true},
		{"a container port", worker(container(nil, corev1.ContainerPort{ContainerPort: 8000})), true},
		{"privileged", privileged, false},
		{"a foreign ServiceAccount", func(s *v1alpha2.LLMInferenceServiceSpec) { s.Template.ServiceAccountName = "argocd-server" }, false},
		{"the deprecated serviceAccount field", func(s *v1alpha2.LLMInferenceServiceSpec) { s.Template.DeprecatedServiceAccount = "default" }, false},
		{"the picker under a foreign ServiceAccount", scheduler("default"), false},
		{"allowPrivilegeEscalation", worker(container(&corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(true)})), false},
		{"SYS_ADMIN", worker(container(caps("SYS_ADMIN"))), false},
		{"hostNetwork", worker(corev1.PodSpec{HostNetwork: true, Containers: container(nil).Containers}), false},
		{"hostPID", worker(corev1.PodSpec{HostPID: true, Containers: container(nil).Containers}), false},
		{"hostIPC", worker(corev1.PodSpec{HostIPC: true, Containers: container(nil).Containers}), false},
		{"a hostPath volume", worker(corev1.PodSpec{Containers: container(nil).Containers, Volumes: []corev1.Volume{{Name: "root",
			VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}}), false},
		{"a hostPort", worker(container(nil, corev1.ContainerPort{ContainerPort: 8000, HostPort: 8000})), false},
		{"a privileged init container in prefill", func(s *v1alpha2.LLMInferenceServiceSpec) {
			s.Prefill = &v1alpha2.WorkloadSpec{Template: &corev1.PodSpec{Containers: container(nil).Containers,
				InitContainers: []corev1.Container{{Name: "init", Image: "x", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}}}
		}, false},
		{"a prefill worker on the host network", func(s *v1alpha2.LLMInferenceServiceSpec) {
			s.Prefill = &v1alpha2.WorkloadSpec{Worker: &corev1.PodSpec{HostNetwork: true, Containers: container(nil).Containers}, Parallelism: pipeline}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := service(ns, tc.change)
			unsafe := svc.Spec.UnsafePods(svc.Name + "-epp-sa")
			if (len(unsafe) == 0) != tc.safe {
				t.Errorf("UnsafePods %q; want safe: %v", unsafe, tc.safe)
			}
			cfg := &v1alpha2.LLMInferenceServiceConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svc.Name}, Spec: svc.Spec}
			for _, o := range []client.Object{svc, cfg} {
				err := c.Create(t.Context(), o, client.DryRunAll)
				switch {
				case tc.safe && err != nil:
					t.Errorf("%T refused: %v", o, err)
				case !tc.safe && !apierrors.IsForbidden(err):
					t.Errorf("%T: %v; want it refused", o, err)
				case !tc.safe:
					t.Logf("%T refused: %v", o, err)
				}
			}
		})
	}
}
