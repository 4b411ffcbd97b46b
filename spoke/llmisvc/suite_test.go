package llmisvc_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/fleetinfer/fleetinfer/apis"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/deploy/crds"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/internal/testutil/testenv"
	"github.com/fleetinfer/fleetinfer/spoke"
	"github.com/fleetinfer/fleetinfer/spoke/llmisvc"
)

// The suite runs the reconciler against a real API server with the CRDs a
// spoke has and kube-controller-manager limited to garbage collection and
// namespaces: nothing turns Deployments into pods, so tests mark workloads
// available themselves, as KServe's suites do.
var (
	env *testenv.Env
	c   client.Client
)

const systemNS = "fleetinfer-system"

// waitTimeout bounds each wait for the controller.
const waitTimeout = 30 * time.Second

var options = spoke.Options{
	InstallPresets: true,
	Options: llmisvc.Options{
		SystemNamespace: systemNS,
		PresetPrefix:    "kserve-",
		Global: llmisvc.GlobalConfig{
			SystemNamespace: systemNS, IngressGatewayName: "inference-gateway", IngressGatewayNamespace: systemNS,
			ModelBasedRoutingHeaderName: "X-Gateway-Model-Name",
		},
	},
}

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	flag.Parse()
	// Fuzz targets need no API server, and each fuzz worker runs TestMain.
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		os.Exit(m.Run())
	}
	own, err := apis.CRDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	third, err := crds.ThirdParty(crds.GroupGIE, crds.GroupGIEExperiment, crds.GroupLWS, crds.GroupGateway)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(testenv.Run(m, testenv.Options{
		CRDs:              append(own, third...),
		ControllerManager: true,
		Controllers:       "garbagecollector,namespace,serviceaccount",
		Scheme:            spoke.Scheme,
	}, &env, startController))
}

// startController runs the spoke's controllers in this process until the
// suite ends.
func startController(ctx context.Context, e *testenv.Env) error {
	c = e.Client
	mgr, err := ctrl.NewManager(e.Config, spoke.ManagerOptions(ctrl.Options{Metrics: metricsserver.Options{BindAddress: "0"}}))
	if err != nil {
		return err
	}
	if err := spoke.Setup(ctx, mgr, options); err != nil {
		return err
	}
	go func() { _ = mgr.Start(ctx) }()
	return nil
}

// --- helpers ---

// service creates an LLMInferenceService from YAML in namespace ns.
func service(t *testing.T, ns, doc string) *v1alpha2.LLMInferenceService {
	t.Helper()
	svc := &v1alpha2.LLMInferenceService{}
	if err := yaml.UnmarshalStrict([]byte(doc), svc); err != nil {
		t.Fatal(err)
	}
	svc.Namespace = ns
	if err := c.Create(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	return svc
}

// condition waits until the service has condition typ with status and,
// if reason is not empty, that reason; it returns the service.
func condition(t *testing.T, key client.ObjectKey, typ v1alpha2.ConditionType, status corev1.ConditionStatus, reason string) *v1alpha2.LLMInferenceService {
	t.Helper()
	svc := &v1alpha2.LLMInferenceService{}
	testutil.Eventually(t, waitTimeout, fmt.Sprintf("%s=%s/%s", typ, status, reason), func(ctx context.Context) error {
		if err := c.Get(ctx, key, svc); err != nil {
			return err
		}
		cond := svc.Status.GetCondition(typ)
		if cond == nil || cond.Status != status || (reason != "" && cond.Reason != reason) {
			return fmt.Errorf("have %+v; all: %s", cond, conditions(svc))
		}
		if svc.Status.ObservedGeneration != svc.Generation {
			return fmt.Errorf("status for generation %d, object at %d", svc.Status.ObservedGeneration, svc.Generation)
		}
		return nil
	})
	return svc
}

func conditions(svc *v1alpha2.LLMInferenceService) string {
	var parts []string
	for _, c := range svc.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, "; ")
}

// get waits for obj to exist and fetches it.
func get(t *testing.T, key client.ObjectKey, obj client.Object) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, fmt.Sprintf("%T %s exists", obj, key), func(ctx context.Context) error { return c.Get(ctx, key, obj) })
}

// gone waits until obj no longer exists.
func gone(t *testing.T, key client.ObjectKey, obj client.Object) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, fmt.Sprintf("%T %s deleted", obj, key), func(ctx context.Context) error {
		err := c.Get(ctx, key, obj)
		if err == nil {
			return fmt.Errorf("still exists")
		}
		return client.IgnoreNotFound(err)
	})
}

// markAvailable plays the Deployment controller: it reports the Deployment
// rolled out with all replicas available.
func markAvailable(t *testing.T, key client.ObjectKey) {
	t.Helper()
	d := &appsv1.Deployment{}
	get(t, key, d)
	testutil.Eventually(t, waitTimeout, "deployment status", func(ctx context.Context) error {
		if err := c.Get(ctx, key, d); err != nil {
			return err
		}
		n := int32(1)
		if d.Spec.Replicas != nil {
			n = *d.Spec.Replicas
		}
		d.Status = appsv1.DeploymentStatus{
			ObservedGeneration: d.Generation, Replicas: n, ReadyReplicas: n, AvailableReplicas: n, UpdatedReplicas: n,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue,
				Reason: "MinimumReplicasAvailable", LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		}
		return c.Status().Update(ctx, d)
	})
}

// events lists the reasons of events about the named object.
func events(ctx context.Context, ns, name string) ([]string, error) {
	var list corev1.EventList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out, nil
}
