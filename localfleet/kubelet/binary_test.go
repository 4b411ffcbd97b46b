package kubelet

import (
	"slices"
	"strings"
	"testing"
)

// Port flags and address flags (controller-runtime's --metrics-bind-address)
// are moved to free local ports, addresses onto 127.0.0.1; flags the
// container leaves out get their default port; other flags pass unchanged.
func TestBinaryRuntimeRewritesPortAndAddressFlags(t *testing.T) {
	r := BinaryRuntime{Binary: "/bin/spoke", Flags: PortFlags{
		Ports:     map[string]int32{"grpc-port": 9002},
		Addresses: map[string]int32{"metrics-bind-address": 8080, "health-probe-bind-address": 8081}}}
	tests := []struct {
		name      string
		args      []string
		wantArgs  []string
		wantPorts []int32
	}{
		{"given as flag=value", []string{"--grpc-port=9100", "--metrics-bind-address=:8443", "--health-probe-bind-address=0.0.0.0:9440", "--leader-elect=true"},
			[]string{"--grpc-port=20000", "--metrics-bind-address=127.0.0.1:20001", "--health-probe-bind-address=127.0.0.1:20002", "--leader-elect=true"},
			[]int32{9100, 8443, 9440}},
		{"given as flag value", []string{"--metrics-bind-address", "[::]:8443", "--grpc-port", "9100", "--health-probe-bind-address=:8081"},
			[]string{"--metrics-bind-address=127.0.0.1:20000", "--grpc-port=20001", "--health-probe-bind-address=127.0.0.1:20002"},
			[]int32{8443, 9100, 8081}},
		{"left out", []string{"--zap-encoder=json"}, nil, []int32{9002, 8080, 8081}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := 20000
			l, err := r.Prepare(t.Context(), &Container{Args: tt.args, FreePort: func() (int, error) { next++; return next - 1, nil }})
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantArgs != nil && !slices.Equal(l.Args, tt.wantArgs) {
				t.Errorf("args %v, want %v", l.Args, tt.wantArgs)
			}
			for _, a := range l.Args {
				if name, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "="); r.Flags.Addresses[name] != 0 && !strings.HasPrefix(v, "127.0.0.1:") {
					t.Errorf("%s is not a loopback address", a)
				}
			}
			for _, p := range tt.wantPorts {
				if _, ok := l.Ports[p]; !ok {
					t.Errorf("pod port %d is not forwarded: %v", p, l.Ports)
				}
			}
			if len(l.Ports) != len(tt.wantPorts) {
				t.Errorf("ports %v, want %v", l.Ports, tt.wantPorts)
			}
		})
	}
}

// A pod-IP flag the container leaves out is set to the pod's address; one it
// sets is left alone.
func TestBinaryRuntimeSetsPodIPFlagsTheContainerLeavesOut(t *testing.T) {
	r := BinaryRuntime{Binary: "/bin/epp", Flags: PortFlags{PodIP: []string{"federation-source-address"}}}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"left out", []string{"--v=2"}, []string{"--v=2", "--federation-source-address=127.12.0.7"}},
		{"given", []string{"--federation-source-address", "127.12.0.9"}, []string{"--federation-source-address", "127.12.0.9"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := r.Prepare(t.Context(), &Container{Args: tc.args, PodIP: "127.12.0.7"})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(l.Args, tc.want) {
				t.Errorf("args %v, want %v", l.Args, tc.want)
			}
		})
	}
}
