package fleet

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/ports"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

// startHubController runs the hub image against the hub as the hub's own user
// (the identity it also has on every spoke), so the audit logs tell its
// writes apart.
func (f *Fleet) startHubController(ctx context.Context) error {
	hub := f.Hub
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: HubUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: HubUser}},
	}
	if err := client.IgnoreAlreadyExists(hub.Client.Create(ctx, crb)); err != nil {
		return err
	}
	cfg, err := hub.UserConfig(HubUser)
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(hub.Dir(), "fleetinfer-hub.kubeconfig")
	if err := controlplane.WriteKubeconfig(kubeconfig, hub.Name(), cfg); err != nil {
		return err
	}
	provider := f.opts.ClusterProvider
	if provider == "" {
		provider = "kubeconfig"
	}
	f.hubBaseArgs = []string{
		"--kubeconfig=" + kubeconfig,
		"--cluster-namespace=" + Namespace,
		"--cluster-provider=" + provider,
		"--probe-interval=1s",
		"--orphan-collection-interval=10s",
	}
	if f.opts.HubReplicas > 1 {
		f.hubBaseArgs = append(f.hubBaseArgs, "--leader-elect", "--leader-election-namespace="+Namespace)
	}
	return f.StartHub(ctx, f.opts.HubArgs)
}

// startSpokeController runs the spoke image against the spoke as a
// separate process, as it runs in a real cluster, and waits until it reports
// ready.
// It uses the admin identity; the Helm chart's RBAC is proven separately.
func (f *Fleet) startSpokeController(ctx context.Context, s *Cluster) error {
	_, err := f.startController(ctx, s, f.Image("spoke"), "spoke-controller", []string{
		"--kubeconfig=" + s.AdminKubeconfig(),
		"--system-namespace=" + Namespace,
		"--default-gateway=" + Namespace + "/" + GatewayName,
	})
	return err
}

// startController runs a controller image's entrypoint with args on
// loopback metrics and probe ports, makes it the cluster's
// ControllerMetrics and waits until it reports ready.
func (f *Fleet) startController(ctx context.Context, c *Cluster, image, name string, args []string) (*process.Process, error) {
	free, err := ports.Free(2)
	if err != nil {
		return nil, err
	}
	probe := net.JoinHostPort("127.0.0.1", strconv.Itoa(free[1]))
	metrics := net.JoinHostPort("127.0.0.1", strconv.Itoa(free[0]))
	p, _, err := f.StartImage(ctx, image, process.Spec{
		Name:    c.Name() + "/" + name,
		Args:    append(args, "--metrics-bind-address="+metrics, "--health-probe-bind-address="+probe),
		LogPath: filepath.Join(c.Dir(), "logs", name+".log"),
	})
	if err != nil {
		return nil, err
	}
	c.ControllerMetrics = "http://" + metrics + "/metrics"
	return p, controlplane.WaitHTTP(ctx, p, http.DefaultClient, "http://"+probe+"/readyz", time.Minute)
}
