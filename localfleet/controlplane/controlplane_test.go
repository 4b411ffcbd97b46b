package controlplane_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

func start(t *testing.T, reg *process.Registry) *controlplane.ControlPlane {
	t.Helper()
	bins, err := binaries.Locate()
	if err != nil {
		t.Fatal(err)
	}
	cp, err := controlplane.New(controlplane.Options{
		Name: "test", Dir: t.TempDir(), Registry: reg, ControllerManager: true,
		Binaries: controlplane.Binaries{Etcd: bins.Etcd, KubeAPIServer: bins.KubeAPIServer,
			KubeControllerManager: bins.KubeControllerManager},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	if err := cp.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return cp
}

// The controller manager runs against the API server: a new namespace gets
// its default ServiceAccount from the serviceaccount controller.
func TestControllerManagerCreatesDefaultServiceAccount(t *testing.T) {
	reg := &process.Registry{}
	cp := start(t, reg)
	cs, err := kubernetes.NewForConfig(cp.Admin())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForServiceAccount(t, cs, "team-a")
}

// waitForServiceAccount waits until the serviceaccount controller has given
// namespace ns its default ServiceAccount.
func waitForServiceAccount(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("namespace %s never got its default service account: %v", ns, err)
	}
}

// A user certificate carries its groups: a user outside system:masters is
// denied by RBAC, so the fleet can hand out least-privilege identities.
func TestUserConfigIsSubjectToRBAC(t *testing.T) {
	cp := start(t, &process.Registry{})
	cfg, err := cp.UserConfig("someone", "some-group")
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("want Forbidden for an unprivileged user, got %v", err)
	}
}

// A stopped control plane comes back with its data, and stopping leaves no
// process behind.
func TestRestartKeepsDataAndStopLeavesNothingRunning(t *testing.T) {
	reg := &process.Registry{}
	cp, cs := startWithData(t, reg)
	ctx := context.Background()
	cp.Stop()
	if alive := reg.Alive(); len(alive) > 0 {
		t.Fatalf("still running after Stop: %v", alive)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{}); err == nil {
		t.Fatal("API server still answers after Stop")
	}
	if err := cp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("configmap lost across restart: %v", err)
	}
	if got.Data["k"] != "v" {
		t.Fatalf("configmap data = %v", got.Data)
	}
}

// Restarting the API server alone replaces that one process: the new one
// serves the same data at the same address, and etcd and the running
// controller manager keep running.
func TestRestartAPIServerReplacesOnlyTheAPIServer(t *testing.T) {
	reg := &process.Registry{}
	cp, cs := startWithData(t, reg)
	ctx := context.Background()
	// kube-controller-manager gives up (exits) when the API server is not
	// healthy within 10 s of its own start, as it does in any cluster, where
	// the kubelet restarts it. The restart under test is of a control plane
	// in service, so it waits until the controllers run.
	waitForServiceAccount(t, cs, "default")
	pids := map[string]int{}
	for _, p := range reg.Started() {
		pids[p.Name] = p.PID()
	}
	if err := cp.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{}); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	apiservers := 0
	for _, p := range reg.Started() {
		switch {
		case p.Name == cp.Name()+"/kube-apiserver":
			apiservers++
			if p.Exited() == (p.PID() != pids[p.Name]) {
				t.Errorf("API server pid %d exited=%v; the first was %d", p.PID(), p.Exited(), pids[p.Name])
			}
		case p.Exited():
			t.Errorf("%s exited", p.Name)
		}
	}
	if apiservers != 2 {
		t.Errorf("%d API servers started, want the first and its replacement", apiservers)
	}
}

// startWithData starts a control plane holding ConfigMap default/kept
// (k=v), for tests of what a restart keeps.
func startWithData(t *testing.T, reg *process.Registry) (*controlplane.ControlPlane, kubernetes.Interface) {
	t.Helper()
	cp := start(t, reg)
	cs, err := kubernetes.NewForConfig(cp.Admin())
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cp, cs
}
