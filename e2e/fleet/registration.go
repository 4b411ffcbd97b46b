package fleet

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/fleetinfer/fleetinfer/e2e/controlplane"
	"github.com/fleetinfer/fleetinfer/e2e/kubelet"
)

// Registration, in the two forms the hub reads.
const (
	// KubeconfigSecretLabel marks a Secret as a cluster for
	// multicluster-runtime's kubeconfig provider.
	KubeconfigSecretLabel = "sigs.k8s.io/multicluster-runtime-kubeconfig"
	// KubeconfigSecretKey holds the kubeconfig in that Secret.
	KubeconfigSecretKey = "kubeconfig"
	// HubUser is the identity the hub uses on every spoke.
	HubUser = "fleetinfer-hub"
)

// registerSpokes gives the hub access to every spoke (a kubeconfig Secret in
// fleetinfer-system) and creates its OCM ManagedCluster, then starts one
// registration agent per spoke that keeps the ManagedCluster's status
// (availability, GPU capacity) current, as OCM's klusterlet does.
func (f *Fleet) registerSpokes(ctx, agentCtx context.Context) error {
	hub := f.Hub.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}
	if err := client.IgnoreAlreadyExists(hub.Create(ctx, ns)); err != nil {
		return err
	}
	for _, s := range f.Spokes {
		if err := f.grantHubAccess(ctx, s); err != nil {
			return err
		}
		if err := f.createManagedCluster(ctx, s); err != nil {
			return err
		}
		// Publish the first status before returning so callers see
		// capacity right away.
		a := &agent{f: f, spoke: s, lastSeen: time.Now()}
		a.sync(ctx)
		f.agents.Add(1)
		go func() {
			defer f.agents.Done()
			a.run(agentCtx)
		}()
	}
	return nil
}

// grantHubAccess issues the hub's client certificate for the spoke, binds it
// to cluster-admin there, and stores its kubeconfig on the hub.
func (f *Fleet) grantHubAccess(ctx context.Context, s *Cluster) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: HubUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: HubUser}},
	}
	if err := client.IgnoreAlreadyExists(s.Client.Create(ctx, crb)); err != nil {
		return err
	}
	cfg, err := s.UserConfig(HubUser)
	if err != nil {
		return err
	}
	kc, err := controlplane.Kubeconfig(s.Name(), cfg)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s.Name(), Namespace: Namespace}}
	_, err = controllerutil.CreateOrUpdate(ctx, f.Hub.Client, sec, func() error {
		sec.Labels = map[string]string{KubeconfigSecretLabel: "true"}
		sec.Data = map[string][]byte{KubeconfigSecretKey: kc}
		return nil
	})
	return err
}

func (f *Fleet) createManagedCluster(ctx context.Context, s *Cluster) error {
	mc := &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: s.Name()}}
	_, err := controllerutil.CreateOrUpdate(ctx, f.Hub.Client, mc, func() error {
		mc.Labels = map[string]string{"name": s.Name(), "cluster.open-cluster-management.io/clusterset": "default"}
		for k, v := range s.Spec.Labels {
			mc.Labels[k] = v
		}
		mc.Spec.HubAcceptsClient = true
		mc.Spec.LeaseDurationSeconds = int32(f.opts.AvailabilityGrace / 5 / time.Second)
		mc.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: s.URL(), CABundle: s.CACert()}}
		return nil
	})
	return err
}

// agent plays OCM's registration agent for one spoke: it reads the spoke's
// nodes and writes availability and capacity to the ManagedCluster.
type agent struct {
	f        *Fleet
	spoke    *Cluster
	lastSeen time.Time
}

func (a *agent) run(ctx context.Context) {
	t := time.NewTicker(a.f.opts.StatusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.sync(ctx)
		}
	}
}

func (a *agent) sync(ctx context.Context) {
	readCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var nodes corev1.NodeList
	err := a.spoke.Client.List(readCtx, &nodes)
	if err == nil {
		a.lastSeen = time.Now()
	}
	if err := a.publish(ctx, nodes.Items, err); err != nil && ctx.Err() == nil {
		a.f.opts.Log.V(1).Info("registration status not written", "cluster", a.spoke.Name(), "err", err.Error())
	}
}

// publish writes the ManagedCluster status: capacity from the nodes when the
// spoke answered, Available=Unknown once it has been silent for longer than
// the availability grace.
func (a *agent) publish(ctx context.Context, nodes []corev1.Node, readErr error) error {
	mc := &clusterv1.ManagedCluster{}
	if err := a.f.Hub.Client.Get(ctx, client.ObjectKey{Name: a.spoke.Name()}, mc); err != nil {
		return err
	}
	before := mc.Status.DeepCopy()
	set := func(t string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&mc.Status.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: mc.Generation})
	}
	set(clusterv1.ManagedClusterConditionHubAccepted, metav1.ConditionTrue, "HubClusterAdminAccepted", "Accepted by the local fleet.")
	set(clusterv1.ManagedClusterConditionJoined, metav1.ConditionTrue, "ManagedClusterJoined", "Managed cluster joined.")
	switch {
	case readErr == nil:
		set(clusterv1.ManagedClusterConditionAvailable, metav1.ConditionTrue, "ManagedClusterAvailable", "Managed cluster is available.")
		mc.Status.Capacity, mc.Status.Allocatable = sumResources(nodes)
		mc.Status.Version.Kubernetes = "v1.36.3"
		mc.Status.ClusterClaims = claims(a.spoke, nodes)
	case time.Since(a.lastSeen) > a.f.opts.AvailabilityGrace:
		set(clusterv1.ManagedClusterConditionAvailable, metav1.ConditionUnknown, "ManagedClusterLeaseUpdateStopped",
			fmt.Sprintf("Registration agent stopped updating its lease: the API server has not answered since %s (%v).",
				a.lastSeen.UTC().Format(time.RFC3339), readErr))
	}
	if equality.Semantic.DeepEqual(before, &mc.Status) {
		return nil
	}
	err := a.f.Hub.Client.Status().Update(ctx, mc)
	if apierrors.IsConflict(err) {
		return nil // retried on the next tick
	}
	return err
}

// sumResources adds up node capacity and allocatable, which is what OCM's
// agent reports (allocatable is not reduced by running pods).
func sumResources(nodes []corev1.Node) (capacity, allocatable clusterv1.ResourceList) {
	capacity, allocatable = clusterv1.ResourceList{}, clusterv1.ResourceList{}
	add := func(into clusterv1.ResourceList, from corev1.ResourceList) {
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, kubelet.GPUResource} {
			q, ok := from[name]
			if !ok {
				continue
			}
			sum := into[clusterv1.ResourceName(name)]
			sum.Add(q)
			into[clusterv1.ResourceName(name)] = sum
		}
	}
	for _, n := range nodes {
		add(capacity, n.Status.Capacity)
		add(allocatable, n.Status.Allocatable)
	}
	if _, ok := capacity[clusterv1.ResourceName(kubelet.GPUResource)]; !ok {
		capacity[clusterv1.ResourceName(kubelet.GPUResource)] = resource.MustParse("0")
		allocatable[clusterv1.ResourceName(kubelet.GPUResource)] = resource.MustParse("0")
	}
	return capacity, allocatable
}

// AcceleratorsClaim lists the GPU products of a cluster's nodes, comma
// separated.
const AcceleratorsClaim = "accelerators.fleetinfer.io"

// claims are OCM's well-known cluster claims plus the accelerator products
// present.
func claims(s *Cluster, nodes []corev1.Node) []clusterv1.ManagedClusterClaim {
	out := []clusterv1.ManagedClusterClaim{
		{Name: "id.k8s.io", Value: s.Name()},
		{Name: "kubeversion.open-cluster-management.io", Value: "v1.36.3"},
		{Name: "platform.open-cluster-management.io", Value: "LocalFleet"},
	}
	if r := s.Spec.Labels["region"]; r != "" {
		out = append(out, clusterv1.ManagedClusterClaim{Name: "region.open-cluster-management.io", Value: r})
	}
	products := map[string]bool{}
	for _, n := range nodes {
		if p := n.Labels[kubelet.GPUProductLabel]; p != "" {
			products[p] = true
		}
	}
	names := make([]string, 0, len(products))
	for p := range products {
		names = append(names, p)
	}
	sort.Strings(names)
	if len(names) > 0 {
		out = append(out, clusterv1.ManagedClusterClaim{Name: AcceleratorsClaim, Value: strings.Join(names, ",")})
	}
	return out
}
