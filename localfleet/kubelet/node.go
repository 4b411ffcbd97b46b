package kubelet

import (
	"context"
	"fmt"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/internal/nodestatus"
)

// NodeSpec describes a fake node. GPUs are advertised the way the NVIDIA
// device plugin and GPU feature discovery do: an nvidia.com/gpu extended
// resource and nvidia.com/gpu.* labels.
type NodeSpec struct {
	Name string
	// GPUs is the node's nvidia.com/gpu capacity; 0 for a CPU node.
	GPUs int
	// GPUProduct is the accelerator model, e.g. "NVIDIA-H100-80GB-HBM3".
	GPUProduct string
	// GPUMemoryMiB is the memory of one GPU.
	GPUMemoryMiB int
	// CPU and Memory default to 64 cores and 512Gi.
	CPU, Memory string
	Labels      map[string]string
	Taints      []corev1.Taint
	// EphemeralStorage is the local disk the kubelet reports, 1Ti by
	// default.
	EphemeralStorage string
}

// gpuCountLabel is the GPU count NVIDIA's GPU feature discovery puts on a
// node next to its product and memory labels.
const gpuCountLabel = "nvidia.com/gpu.count"

const (
	leaseRenewInterval  = 10 * time.Second
	leaseDurationSecond = 40
)

func (n NodeSpec) object(ip, version string) (*corev1.Node, error) {
	cpu, mem, disk := n.CPU, n.Memory, n.EphemeralStorage
	if cpu == "" {
		cpu = "64"
	}
	if mem == "" {
		mem = "512Gi"
	}
	if disk == "" {
		disk = "1Ti"
	}
	capacity := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")}
	for name, v := range map[corev1.ResourceName]string{corev1.ResourceCPU: cpu, corev1.ResourceMemory: mem, corev1.ResourceEphemeralStorage: disk} {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("node %s: %s %q: %w", n.Name, name, v, err)
		}
		capacity[name] = q
	}
	labels := map[string]string{
		corev1.LabelHostname:   n.Name,
		corev1.LabelOSStable:   "linux",
		corev1.LabelArchStable: "amd64",
	}
	if n.GPUs > 0 {
		capacity[accelerator.NVIDIA] = *resource.NewQuantity(int64(n.GPUs), resource.DecimalSI)
		labels[gpuCountLabel] = strconv.Itoa(n.GPUs)
		if n.GPUProduct != "" {
			labels[accelerator.NVIDIAProductLabel] = n.GPUProduct
		}
		if n.GPUMemoryMiB > 0 {
			labels[accelerator.NVIDIAMemoryLabel] = strconv.Itoa(n.GPUMemoryMiB)
		}
	}
	for k, v := range n.Labels {
		labels[k] = v
	}
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: n.Taints},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity,
			Phase:       corev1.NodeRunning,
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: ip},
				{Type: corev1.NodeHostName, Address: n.Name},
			},
			Conditions: []corev1.NodeCondition{
				cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "local kubelet is posting ready status"),
				cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", ""),
				cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", ""),
				cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", ""),
			},
			NodeInfo: corev1.NodeSystemInfo{
				KubeletVersion: version, OperatingSystem: "linux", Architecture: "amd64",
				ContainerRuntimeVersion: "localfleet://1",
			},
		},
	}, nil
}

// registerNode creates or refreshes the node and its status.
func (k *Kubelet) registerNode(ctx context.Context, n NodeSpec, ip string) error {
	want, err := n.object(ip, k.opts.Version)
	if err != nil {
		return err
	}
	nodes := k.cs.CoreV1().Nodes()
	got, err := nodes.Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := nodes.Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Labels, cur.Spec.Taints = want.Labels, want.Spec.Taints
			got, err = nodes.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", n.Name, err)
	}
	if got, err = k.postStatus(ctx, n, ip); err != nil {
		return err
	}
	return k.renewLease(ctx, got)
}

// postStatus writes the node's status as the kubelet sees it: Ready, its
// capacity and addresses. The node lifecycle controller writes to nodes
// too (it marks a node whose lease lapsed Unknown); retry on its updates.
func (k *Kubelet) postStatus(ctx context.Context, n NodeSpec, ip string) (*corev1.Node, error) {
	want, err := n.object(ip, k.opts.Version)
	if err != nil {
		return nil, err
	}
	nodes := k.cs.CoreV1().Nodes()
	var got *corev1.Node
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := nodes.Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status = want.Status
		got, err = nodes.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("node %s status: %w", n.Name, err)
	}
	return got, nil
}

// renewLease keeps the node's heartbeat in kube-node-lease, which the node
// lifecycle controller reads to decide that a node is alive.
func (k *Kubelet) renewLease(ctx context.Context, node *corev1.Node) error {
	leases := k.cs.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, node.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: node.Name, OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node.Name),
				LeaseDurationSeconds: ptr.To(int32(leaseDurationSecond)), RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// heartbeat renews every node's lease until ctx ends. A node that vanished
// (for example its cluster was restored from nothing) is registered again,
// and one that is not Ready gets its status posted again, as a real
// kubelet does: the node lifecycle controller marks a node Unknown when
// its lease lapses (an API server down longer than the grace period), and
// only the kubelet turns it Ready again.
func (k *Kubelet) heartbeat(ctx context.Context) {
	t := time.NewTicker(leaseRenewInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		k.beat(ctx)
	}
}

// beat is one heartbeat of every node.
func (k *Kubelet) beat(ctx context.Context) {
	for _, n := range k.opts.Nodes {
		node, err := k.cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			err = k.registerNode(ctx, n, k.nodeIPs[n.Name])
		case err == nil && !nodestatus.Ready(node):
			if node, err = k.postStatus(ctx, n, k.nodeIPs[n.Name]); err == nil {
				err = k.renewLease(ctx, node)
			}
		case err == nil:
			err = k.renewLease(ctx, node)
		}
		if err != nil && ctx.Err() == nil {
			k.log.V(1).Info("node heartbeat failed", "node", n.Name, "err", err.Error())
		}
	}
}
