package fleet

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterinventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/hub/clusterprofile"
	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// Registration, in the forms the hub reads.
const (
	// KubeconfigSecretLabel marks a Secret as a cluster for
	// multicluster-runtime's kubeconfig provider.
	KubeconfigSecretLabel = "sigs.k8s.io/multicluster-runtime-kubeconfig"
	// KubeconfigSecretKey holds the kubeconfig in that Secret.
	KubeconfigSecretKey = "kubeconfig"
	// HubUser is the identity the hub uses on every spoke, and the hub's
	// consumer name in the ClusterProfile Secrets.
	HubUser = "fleetinfer-hub"
	// ClusterManager names the fleet as the manager of its ClusterProfiles.
	ClusterManager = "fleetinfer-local"
)

// registerSpokes gives the hub access to every spoke (a kubeconfig Secret in
// fleetinfer-system, in the kubeconfig provider's form and in the
// ClusterProfile Secret strategy's) and creates its OCM ManagedCluster and
// its ClusterProfile, all spokes at once, then starts one registration agent
// per spoke that keeps both statuses (availability, GPU capacity) current,
// as OCM's klusterlet and ClusterProfile controllers do.
func (f *Fleet) registerSpokes(ctx, agentCtx context.Context) error {
	hub := f.Hub.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace,
		Labels: map[string]string{clusterinventoryv1alpha1.LabelClusterSetKey: clusterSet}}}
	if err := client.IgnoreAlreadyExists(hub.Create(ctx, ns)); err != nil {
		return err
	}
	agents := make([]*agent, len(f.Spokes))
	g, gctx := errgroup.WithContext(ctx)
	for i, s := range f.Spokes {
		g.Go(func() error {
			if err := f.grantHubAccess(gctx, s); err != nil {
				return err
			}
			if err := f.createManagedCluster(gctx, s); err != nil {
				return err
			}
			if err := f.createClusterProfile(gctx, s); err != nil {
				return err
			}
			// Publish the first status before returning so callers see
			// capacity right away.
			agents[i] = &agent{f: f, spoke: s, lastSeen: time.Now()}
			agents[i].sync(gctx)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, a := range agents {
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
	cfg.Host = s.HubURL
	kc, err := controlplane.Kubeconfig(s.Name(), cfg)
	if err != nil {
		return err
	}
	for _, sec := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: s.Name(), Namespace: Namespace,
			Labels: map[string]string{KubeconfigSecretLabel: "true"}},
			Data: map[string][]byte{KubeconfigSecretKey: kc}},
		{ObjectMeta: metav1.ObjectMeta{Name: s.Name() + "-" + HubUser, Namespace: Namespace,
			Labels: map[string]string{clusterprofile.ConsumerLabel: HubUser, clusterprofile.ProfileLabel: s.Name()}},
			Data: map[string][]byte{clusterprofile.SecretKey: kc}},
	} {
		want := sec.DeepCopy()
		if _, err := controllerutil.CreateOrUpdate(ctx, f.Hub.Client, sec, func() error {
			sec.Labels, sec.Data = want.Labels, want.Data
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// clusterSet is the ClusterSet of every spoke, in OCM's and the Cluster
// Inventory API's terms.
const clusterSet = "default"

// registrationLabels are the labels of a spoke's ManagedCluster and
// ClusterProfile.
// In flat mode they name the pod network every spoke shares.
func (f *Fleet) registrationLabels(s *Cluster) map[string]string {
	l := map[string]string{"name": s.Name(), "cluster.open-cluster-management.io/clusterset": clusterSet}
	for k, v := range s.Spec.Labels {
		l[k] = v
	}
	if f.PodNetwork() == wan.Flat {
		l[fleetv1alpha1.PodNetworkLabel] = PodNetworkName
	}
	return l
}

func (f *Fleet) createManagedCluster(ctx context.Context, s *Cluster) error {
	mc := &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: s.Name()}}
	_, err := controllerutil.CreateOrUpdate(ctx, f.Hub.Client, mc, func() error {
		mc.Labels = f.registrationLabels(s)
		mc.Spec.HubAcceptsClient = true
		mc.Spec.LeaseDurationSeconds = int32(f.opts.AvailabilityGrace / 5 / time.Second)
		mc.Spec.ManagedClusterClientConfigs = []clusterv1.ClientConfig{{URL: s.HubURL, CABundle: s.CACert()}}
		return nil
	})
	return err
}

// createClusterProfile registers the spoke in the Cluster Inventory API, in
// the fleet's namespace as the ClusterSet; its status comes from the agent.
func (f *Fleet) createClusterProfile(ctx context.Context, s *Cluster) error {
	cp := &clusterinventoryv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{Name: s.Name(), Namespace: Namespace}}
	_, err := controllerutil.CreateOrUpdate(ctx, f.Hub.Client, cp, func() error {
		cp.Labels = f.registrationLabels(s)
		cp.Labels[clusterinventoryv1alpha1.LabelClusterManagerKey] = ClusterManager
		cp.Spec.DisplayName = s.Name()
		cp.Spec.ClusterManager.Name = ClusterManager
		return nil
	})
	return err
}

// agent plays OCM's registration agent for one spoke: it reads the spoke's
// nodes and writes availability and capacity to the ManagedCluster, and
// mirrors them into the ClusterProfile.
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
	if !equality.Semantic.DeepEqual(before, &mc.Status) {
		// A conflict is retried on the next tick.
		if err := a.f.Hub.Client.Status().Update(ctx, mc); err != nil && !apierrors.IsConflict(err) {
			return err
		}
	}
	return a.publishProfile(ctx, &mc.Status)
}

// publishProfile mirrors the ManagedCluster's status into the
// ClusterProfile as OCM's ClusterProfile controller does: Available as
// ControlPlaneHealthy, the Kubernetes version, the claims as properties.
func (a *agent) publishProfile(ctx context.Context, st *clusterv1.ManagedClusterStatus) error {
	cp := &clusterinventoryv1alpha1.ClusterProfile{}
	if err := a.f.Hub.Client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: a.spoke.Name()}, cp); err != nil {
		return err
	}
	before := cp.Status.DeepCopy()
	if c := meta.FindStatusCondition(st.Conditions, clusterv1.ManagedClusterConditionAvailable); c != nil {
		meta.SetStatusCondition(&cp.Status.Conditions, metav1.Condition{Type: clusterinventoryv1alpha1.ClusterConditionControlPlaneHealthy,
			Status: c.Status, Reason: c.Reason, Message: c.Message, ObservedGeneration: cp.Generation})
	}
	cp.Status.Version.Kubernetes = st.Version.Kubernetes
	cp.Status.Properties = properties(cp.Status.Properties, st.ClusterClaims, metav1.Now())
	if equality.Semantic.DeepEqual(before, &cp.Status) {
		return nil
	}
	err := a.f.Hub.Client.Status().Update(ctx, cp)
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// properties are the claims as ClusterProfile properties. A property keeps
// the time its value was first observed: refreshing it on every tick would
// rewrite every profile every StatusInterval.
func properties(old []clusterinventoryv1alpha1.Property, claims []clusterv1.ManagedClusterClaim, now metav1.Time) []clusterinventoryv1alpha1.Property {
	out := make([]clusterinventoryv1alpha1.Property, 0, len(claims))
	for _, c := range claims {
		p := clusterinventoryv1alpha1.Property{Name: c.Name, Value: c.Value, LastObservedTime: now}
		for _, o := range old {
			if o.Name == c.Name && o.Value == c.Value {
				p.LastObservedTime = o.LastObservedTime
			}
		}
		out = append(out, p)
	}
	return out
}

// sumResources adds up node capacity and allocatable, which is what OCM's
// agent reports (allocatable is not reduced by running pods).
func sumResources(nodes []corev1.Node) (capacity, allocatable clusterv1.ResourceList) {
	capacity, allocatable = clusterv1.ResourceList{}, clusterv1.ResourceList{}
	add := func(into clusterv1.ResourceList, from corev1.ResourceList) {
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, accelerator.NVIDIA} {
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
	if _, ok := capacity[clusterv1.ResourceName(accelerator.NVIDIA)]; !ok {
		capacity[clusterv1.ResourceName(accelerator.NVIDIA)] = resource.MustParse("0")
		allocatable[clusterv1.ResourceName(accelerator.NVIDIA)] = resource.MustParse("0")
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
		// The hub publishes the range with the spoke's entry in peer
		// directories: pickers refuse its endpoints outside it.
		{Name: fleetv1alpha1.PodCIDRsProperty, Value: SpokeNetwork(s.NetworkIndex).String()},
	}
	if r := s.Spec.Labels["region"]; r != "" {
		out = append(out, clusterv1.ManagedClusterClaim{Name: "region.open-cluster-management.io", Value: r})
	}
	products := map[string]bool{}
	for _, n := range nodes {
		if p := n.Labels[accelerator.NVIDIAProductLabel]; p != "" {
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
