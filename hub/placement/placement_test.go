package placement

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
)

// gpuCluster has nodes of 8 GPUs of one product with the given free counts.
func gpuCluster(name, product string, free ...int64) Cluster {
	a := fleetv1alpha1.AcceleratorCapacity{Product: product, Resource: "nvidia.com/gpu"}
	for _, f := range free {
		a.Allocatable += 8
		a.Free += f
		a.FreeNodes = append(a.FreeNodes, fleetv1alpha1.FreeBucket{Free: f, Nodes: 1})
	}
	return Cluster{Name: name, Healthy: true, Labels: map[string]string{"name": name},
		Capacity: &fleetv1alpha1.ClusterCapacityStatus{Accelerators: []fleetv1alpha1.AcceleratorCapacity{a}}}
}

func summary(d Decision) string {
	var parts []string
	for _, c := range d.Clusters {
		parts = append(parts, fmt.Sprintf("%s=%d", c.Name, c.Replicas))
	}
	s := strings.Join(parts, ",")
	if d.Unplaced > 0 {
		s += fmt.Sprintf(" unplaced=%d", d.Unplaced)
	}
	return s
}

func spec(strategy fleetv1alpha1.ReplicaStrategy) fleetv1alpha1.InferencePlacementSpec {
	return fleetv1alpha1.InferencePlacementSpec{Replicas: fleetv1alpha1.ReplicaScheduling{Strategy: strategy}}
}

// decideCase is a request, the clusters to place it on and the summary of
// the decision.
type decideCase struct {
	name     string
	req      Request
	clusters []Cluster
	want     string
}

func decideCases() []decideCase {
	h100 := Need{Product: "H100", PerPod: 1, Pods: 1}
	fleet := []Cluster{
		gpuCluster("east", "H100", 8, 8), // room 16
		gpuCluster("west", "H100", 4),    // room 4
		gpuCluster("central", "L40S", 4), // wrong product
	}
	sick := gpuCluster("south", "H100", 8)
	sick.Healthy = false
	withSick := append(append([]Cluster{}, fleet...), sick)

	weighted := spec(fleetv1alpha1.Weighted)
	weighted.Replicas.Total = ptr.To(int32(6))
	weighted.Replicas.Weights = []fleetv1alpha1.ClusterWeight{{Cluster: "east", Weight: 2}, {Cluster: "west", Weight: 1}}

	free := spec(fleetv1alpha1.FreeCapacity)
	free.Replicas.Total = ptr.To(int32(10))

	over := spec(fleetv1alpha1.Overflow)
	over.Replicas.Total = ptr.To(int32(7))
	over.Replicas.Preference = []string{"west", "east"}

	overTooMany := over
	overTooMany.Replicas.Total = ptr.To(int32(25))

	pickOne := spec(fleetv1alpha1.Duplicated)
	pickOne.MaxClusters = ptr.To(int32(1))

	byLabel := spec(fleetv1alpha1.Duplicated)
	byLabel.Clusters.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"name": "west"}}

	byName := spec(fleetv1alpha1.Duplicated)
	byName.Clusters.Names = []string{"east", "central"}

	return []decideCase{
		{"duplicated runs the service's replicas in every eligible cluster",
			Request{Spec: spec(fleetv1alpha1.Duplicated), Replicas: 2, Need: h100}, fleet, "east=2,west=2"},
		{"a CPU model can go anywhere",
			Request{Spec: spec(fleetv1alpha1.Duplicated), Replicas: 1}, fleet, "central=1,east=1,west=1"},
		{"weighted divides by weight",
			Request{Spec: weighted, Replicas: 1, Need: h100}, fleet, "east=4,west=2"},
		{"free capacity divides by room",
			Request{Spec: free, Replicas: 1, Need: h100}, fleet, "east=8,west=2"},
		{"overflow fills the preferred cluster, then spills",
			Request{Spec: over, Need: h100}, fleet, "west=4,east=3"},
		{"overflow reports what fits nowhere",
			Request{Spec: overTooMany, Need: h100}, fleet, "west=4,east=16 unplaced=5"},
		{"the service's own replicas count as room",
			Request{Spec: over, Need: h100}, []Cluster{withCurrent(gpuCluster("west", "H100", 0), 4), gpuCluster("east", "H100", 8)}, "west=4,east=3"},
		{"max clusters keeps the roomiest",
			Request{Spec: pickOne, Replicas: 1, Need: h100}, fleet, "east=1"},
		{"a label selector narrows the clusters",
			Request{Spec: byLabel, Replicas: 3, Need: h100}, fleet, "west=3"},
		{"names narrow the clusters, the product still applies",
			Request{Spec: byName, Replicas: 1, Need: h100}, fleet, "east=1"},
		{"a failed cluster gets nothing",
			Request{Spec: spec(fleetv1alpha1.Duplicated), Replicas: 1, Need: h100}, withSick, "east=1,west=1"},
		{"an OCM decision limits the clusters",
			Request{Spec: spec(fleetv1alpha1.Duplicated), Replicas: 1, Need: h100, OCMDecided: map[string]bool{"west": true}}, fleet, "west=1"},
		{"multi-node groups need whole groups of pods",
			Request{Spec: free, Need: Need{Product: "H100", PerPod: 4, Pods: 2}}, fleet, "east=2 unplaced=8"},
	}
}

func TestDecide(t *testing.T) {
	for _, c := range decideCases() {
		t.Run(c.name, func(t *testing.T) {
			d, err := Decide(c.req, c.clusters)
			if err != nil {
				t.Fatal(err)
			}
			if got := summary(d); got != c.want {
				t.Errorf("got %s, want %s (%s)", got, c.want, d.Message)
			}
			for _, cd := range d.Clusters {
				if cd.Reason == "" {
					t.Errorf("%s has no reason", cd.Name)
				}
			}
		})
	}
}

func withCurrent(c Cluster, n int32) Cluster {
	c.Current = n
	return c
}

// Clusters left out are named with the reason, so the status can say why.
func TestDecisionExplainsExcludedClusters(t *testing.T) {
	sick := gpuCluster("south", "H100", 8)
	sick.Healthy = false
	stuck := gpuCluster("north", "H100", 8)
	stuck.Stuck = true
	d, err := Decide(Request{Spec: spec(fleetv1alpha1.Duplicated), Replicas: 1, Need: Need{Product: "H100", PerPod: 1, Pods: 1}},
		[]Cluster{gpuCluster("central", "L40S", 4), sick, stuck, {Name: "blind", Healthy: true}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"central (has no H100)", "south (unavailable beyond the failover toleration)",
		"north (its copy was not Ready within the ready timeout)", "blind (capacity not reported)"} {
		if !strings.Contains(d.Message, want) {
			t.Errorf("message %q lacks %q", d.Message, want)
		}
	}
	if d.Unplaced != 1 {
		t.Errorf("unplaced %d", d.Unplaced)
	}
}

func TestApportionIsExactAndRespectsCaps(t *testing.T) {
	cases := []struct {
		n       int32
		w, caps []int64
		want    string
	}{
		{10, []int64{1, 1, 1}, nil, "[4 3 3]"},
		{7, []int64{5, 2}, nil, "[5 2]"},
		{10, []int64{8, 2}, []int64{8, 2}, "[8 2]"},
		{10, []int64{3, 3}, []int64{3, 3}, "[3 3]"},
		{0, []int64{1}, nil, "[0]"},
	}
	for _, c := range cases {
		if got := fmt.Sprint(apportion(c.n, c.w, c.caps)); got != c.want {
			t.Errorf("apportion(%d, %v, %v) = %s, want %s", c.n, c.w, c.caps, got, c.want)
		}
	}
}

func TestPropertyRequirements(t *testing.T) {
	props := map[string]string{"gpu.count": "16", "region": "us-east"}
	cases := []struct {
		req  fleetv1alpha1.PropertyRequirement
		want bool
	}{
		{fleetv1alpha1.PropertyRequirement{Name: "region", Operator: "In", Values: []string{"us-east"}}, true},
		{fleetv1alpha1.PropertyRequirement{Name: "region", Operator: "NotIn", Values: []string{"us-east"}}, false},
		{fleetv1alpha1.PropertyRequirement{Name: "gpu.count", Operator: "Gt", Values: []string{"8"}}, true},
		{fleetv1alpha1.PropertyRequirement{Name: "gpu.count", Operator: "Lt", Values: []string{"8"}}, false},
		{fleetv1alpha1.PropertyRequirement{Name: "zone", Operator: "Exists"}, false},
		{fleetv1alpha1.PropertyRequirement{Name: "zone", Operator: "DoesNotExist"}, true},
	}
	for _, c := range cases {
		if got := propertiesMatch([]fleetv1alpha1.PropertyRequirement{c.req}, props); got != c.want {
			t.Errorf("%+v: %v, want %v", c.req, got, c.want)
		}
	}
}

// Capacity may limit growth but never shrinks what runs: a cluster holding
// ready replicas of the service stays eligible for at least those, whatever
// its capacity report says; a cluster without the service still needs room.
func TestCapacityNeverEvictsRunningReplicas(t *testing.T) {
	h100 := Need{Resource: "nvidia.com/gpu", Product: "H100", PerPod: 1, Pods: 1}
	cordoned := func(name string) Cluster {
		// Every H100 node cordoned: the spoke reports no H100 at all.
		c := gpuCluster(name, "L40S", 8)
		return c
	}
	unreported := func(name string) Cluster {
		return Cluster{Name: name, Healthy: true, Labels: map[string]string{"name": name}}
	}
	single := spec(fleetv1alpha1.Duplicated)
	single.Clusters.Names = []string{"east"}
	over := spec(fleetv1alpha1.Overflow)
	over.Replicas.Total = ptr.To(int32(3))
	over.Replicas.Preference = []string{"east", "west"}
	free := spec(fleetv1alpha1.FreeCapacity)
	free.Replicas.Total = ptr.To(int32(2))
	cases := []struct {
		name     string
		req      Request
		clusters []Cluster
		want     string // "" when no cluster is chosen
	}{
		{"cordoning every GPU node of a single-cluster placement keeps the cluster and its replicas",
			Request{Spec: single, Replicas: 2, Need: h100}, []Cluster{withCurrent(cordoned("east"), 2)}, "east=2"},
		{"a cluster whose capacity is not reported keeps its replicas",
			Request{Spec: single, Replicas: 2, Need: h100}, []Cluster{withCurrent(unreported("east"), 2)}, "east=2"},
		{"a cluster with no free GPU keeps its replicas",
			Request{Spec: single, Replicas: 2, Need: h100}, []Cluster{withCurrent(gpuCluster("east", "H100", 0), 2)}, "east=2"},
		{"overflow keeps what runs on a cordoned cluster and spills only the rest",
			Request{Spec: over, Need: h100}, []Cluster{withCurrent(cordoned("east"), 2), gpuCluster("west", "H100", 8)}, "east=2,west=1"},
		{"free capacity keeps what runs on an unreported cluster",
			Request{Spec: free, Need: h100}, []Cluster{withCurrent(unreported("east"), 2)}, "east=2"},
		{"growth is still limited: the held replicas are all the room an unreported cluster has",
			Request{Spec: over, Need: h100}, []Cluster{withCurrent(unreported("east"), 1)}, "east=1 unplaced=2"},
		{"a cluster without the service and without a capacity report is still excluded",
			Request{Spec: single, Replicas: 2, Need: h100}, []Cluster{unreported("east")}, " unplaced=2"},
		{"a cluster without the service whose GPU nodes are cordoned is still excluded",
			Request{Spec: single, Replicas: 2, Need: h100}, []Cluster{cordoned("east")}, " unplaced=2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := Decide(c.req, c.clusters)
			if err != nil {
				t.Fatal(err)
			}
			if got := summary(d); strings.TrimSpace(got) != strings.TrimSpace(c.want) {
				t.Errorf("got %q, want %q (%s)", got, c.want, d.Message)
			}
		})
	}
}

func TestClusterSetBindingsLimitTheClusters(t *testing.T) {
	h100 := Need{Product: "H100", PerPod: 1, Pods: 1}
	inSet := func(c Cluster, set string) Cluster {
		c.Labels = map[string]string{"name": c.Name, fleetv1alpha1.ClusterSetLabel: set}
		return c
	}
	fleet := []Cluster{inSet(gpuCluster("east", "H100", 8), "us"), inSet(gpuCluster("west", "H100", 8), "us"),
		inSet(gpuCluster("eu", "H100", 8), "eu"), gpuCluster("lab", "H100", 8)}
	cases := []struct {
		name    string
		bound   map[string]bool
		want    string
		because string
	}{
		{"bindings not required: every cluster", nil, "east=1,eu=1,lab=1,west=1", ""},
		{"no binding: no cluster", map[string]bool{}, " unplaced=1", "east (the namespace has no ClusterSetBinding)"},
		{"a set bound: its clusters", map[string]bool{"us": true}, "east=1,west=1", `eu (cluster set "eu" is not bound to the namespace)`},
		{"a cluster in no set needs global", map[string]bool{"us": true, "eu": true}, "east=1,eu=1,west=1", `lab (in no cluster set, and the namespace does not bind "global")`},
		{"global: every cluster", map[string]bool{"global": true}, "east=1,eu=1,lab=1,west=1", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := Decide(Request{Spec: spec(fleetv1alpha1.Duplicated), Replicas: 1, Need: h100, BoundSets: c.bound}, fleet)
			if err != nil {
				t.Fatal(err)
			}
			if got := summary(d); got != c.want {
				t.Errorf("got %s, want %s (%s)", got, c.want, d.Message)
			}
			if c.because != "" && !strings.Contains(d.Message, c.because) {
				t.Errorf("message %q does not say %q", d.Message, c.because)
			}
		})
	}
}
