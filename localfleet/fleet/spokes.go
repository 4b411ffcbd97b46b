package fleet

import "github.com/fleetinfer/fleetinfer/localfleet/kubelet"

// GPU models of the default fleet, as GPU feature discovery labels them.
const (
	H100 = "NVIDIA-H100-80GB-HBM3"
	A100 = "NVIDIA-A100-SXM4-80GB"
	L40S = "NVIDIA-L40S"
)

// DefaultSpokes is a fleet of three GPU clusters of different sizes and
// speeds: a large H100 cluster, a mid-size A100 cluster and a small L40S
// cluster. The simulator flags give each its own latency model and batch
// capacity, so load-aware routing has something to tell apart.
func DefaultSpokes() []SpokeSpec {
	gpuNodes := func(prefix string, n, gpus int, product string, memMiB int) []kubelet.NodeSpec {
		nodes := make([]kubelet.NodeSpec, n)
		for i := range nodes {
			nodes[i] = kubelet.NodeSpec{Name: prefix + "-gpu-" + string(rune('a'+i)), GPUs: gpus, GPUProduct: product, GPUMemoryMiB: memMiB}
		}
		return nodes
	}
	// East's nodes are shaped like GCP's a3-highgpu-8g, the machine KServe's
	// multi-node data-parallel sample is written for: one of its pods takes
	// 64 of the node's 208 CPUs and all 8 GPUs.
	east := gpuNodes("east", 2, 8, H100, 81559)
	for i := range east {
		east[i].CPU, east[i].Memory = "208", "1872Gi"
	}
	return []SpokeSpec{
		{
			Name: "east", Labels: map[string]string{"region": "us-east"},
			Nodes:         east,
			SimulatorArgs: []string{"--time-to-first-token=40ms", "--inter-token-latency=8ms", "--max-num-seqs=16"},
		},
		{
			Name: "west", Labels: map[string]string{"region": "us-west"},
			Nodes:         gpuNodes("west", 2, 4, A100, 81920),
			SimulatorArgs: []string{"--time-to-first-token=60ms", "--inter-token-latency=12ms", "--max-num-seqs=12"},
		},
		{
			Name: "central", Labels: map[string]string{"region": "eu-central"},
			Nodes:         gpuNodes("central", 1, 4, L40S, 46068),
			SimulatorArgs: []string{"--time-to-first-token=90ms", "--inter-token-latency=20ms", "--max-num-seqs=8"},
		},
	}
}
