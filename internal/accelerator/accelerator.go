// Package accelerator answers, once for the hub and the spoke, which
// extended resources are accelerators, which node label names their
// product, and how many of them a pod takes from a node. The hub sizes a
// replica's need with it and the spoke counts the free accelerators it
// reports with it, so a need and the room for it are always counted alike.
package accelerator

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Accelerator resources of the vendors' device plugins.
const (
	NVIDIA corev1.ResourceName = "nvidia.com/gpu"
	AMD    corev1.ResourceName = "amd.com/gpu"
	TPU    corev1.ResourceName = "google.com/tpu"
	// Intel's GPU plugin advertises one resource per kernel driver.
	IntelI915 corev1.ResourceName = "gpu.intel.com/i915"
	IntelXe   corev1.ResourceName = "gpu.intel.com/xe"
)

// Node labels that name an accelerator's product, as each vendor's feature
// discovery writes them: NVIDIA GPU feature discovery, AMD's node labeller,
// Intel's NFD rules for data-center GPUs, GKE for TPUs.
const (
	NVIDIAProductLabel = "nvidia.com/gpu.product"
	NVIDIAMemoryLabel  = "nvidia.com/gpu.memory"
	AMDProductLabel    = "amd.com/gpu.product-name"
	IntelProductLabel  = "gpu.intel.com/product"
	TPUProductLabel    = "cloud.google.com/gke-tpu-accelerator"
)

// Resources lists the accelerator resources in the order a pod's need is
// looked up.
var Resources = []corev1.ResourceName{NVIDIA, AMD, IntelI915, IntelXe, TPU}

// IsAccelerator reports whether r is a whole-device accelerator resource.
// Intel's fractional resources (gpu.intel.com/millicores, memory.max, tiles)
// are not devices and are not counted.
func IsAccelerator(r corev1.ResourceName) bool {
	switch r {
	case NVIDIA, AMD, IntelI915, IntelXe, TPU:
		return true
	}
	return false
}

// ProductLabel is the node label that names the product of accelerator
// resource r, or "" when the vendor has none.
func ProductLabel(r corev1.ResourceName) string {
	switch {
	case r == NVIDIA:
		return NVIDIAProductLabel
	case r == AMD:
		return AMDProductLabel
	case r == TPU:
		return TPUProductLabel
	case strings.HasPrefix(string(r), "gpu.intel.com/"):
		return IntelProductLabel
	}
	return ""
}

// MemoryLabel is the node label that gives the memory of one accelerator
// of resource r in MiB, or "" when the vendor labels none in MiB.
func MemoryLabel(r corev1.ResourceName) string {
	if r == NVIDIA {
		return NVIDIAMemoryLabel
	}
	return ""
}

// PodRequest is how many of resource r the scheduler reserves on a node
// for a pod with this spec: the larger of its containers together with its
// restartable init containers (sidecars, which run alongside them) and the
// peak of its run-to-completion init containers (each next to the sidecars
// started before it), plus the pod's overhead. A container that sets only a
// limit of an extended resource requests that limit, as the API server
// defaults it.
func PodRequest(spec *corev1.PodSpec, r corev1.ResourceName) int64 {
	var running, sidecars, initPeak int64
	for i := range spec.Containers {
		running += containerRequest(&spec.Containers[i], r)
	}
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		v := containerRequest(c, r)
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sidecars += v
			continue
		}
		initPeak = max(initPeak, sidecars+v)
	}
	return max(running+sidecars, initPeak) + spec.Overhead.Name(r, "").Value()
}

func containerRequest(c *corev1.Container, r corev1.ResourceName) int64 {
	if q, ok := c.Resources.Requests[r]; ok {
		return q.Value()
	}
	return c.Resources.Limits.Name(r, "").Value()
}

// PodNeed is the accelerator resource a pod with this spec requests and how
// many of it (PodRequest); the first of Resources it requests any of, or
// ("", 0) for a pod without accelerators.
func PodNeed(spec *corev1.PodSpec) (corev1.ResourceName, int64) {
	for _, r := range Resources {
		if n := PodRequest(spec, r); n > 0 {
			return r, n
		}
	}
	return "", 0
}
