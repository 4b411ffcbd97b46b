package v1alpha2

import (
	"testing"

	"k8s.io/utils/ptr"
)

func TestGroupSizeCountsPodsOfOneReplica(t *testing.T) {
	cases := []struct {
		name string
		p    *ParallelismSpec
		want int32
	}{
		{"none", nil, 1},
		{"tensor only", &ParallelismSpec{Tensor: ptr.To(int32(4))}, 1},
		{"data over dataLocal", &ParallelismSpec{Data: ptr.To(int32(16)), DataLocal: ptr.To(int32(8))}, 2},
		{"dataLocal above data", &ParallelismSpec{Data: ptr.To(int32(2)), DataLocal: ptr.To(int32(8))}, 1},
		{"data without dataLocal is one rank per pod", &ParallelismSpec{Data: ptr.To(int32(4))}, 4},
		{"dataLocal without data", &ParallelismSpec{DataLocal: ptr.To(int32(8))}, 1},
		{"pipeline", &ParallelismSpec{Pipeline: ptr.To(int32(3))}, 3},
		{"data wins over pipeline", &ParallelismSpec{Data: ptr.To(int32(8)), DataLocal: ptr.To(int32(4)), Pipeline: ptr.To(int32(3))}, 2},
	}
	for _, c := range cases {
		if got := c.p.GroupSize(); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
