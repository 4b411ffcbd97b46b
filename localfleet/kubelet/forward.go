package kubelet

import (
	"net"
	"strconv"

	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// forward makes podIP:port reach a process listening on 127.0.0.1:local,
// standing in for the pod network namespace a real kubelet would create.
// The fabric decides who may connect and through which link; a process
// that is not listening yet (or any more) resets the client's connection,
// as a closed port in the pod would.
func (k *Kubelet) forward(podIP string, port int32, local int) (*wan.Server, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(podIP, strconv.Itoa(int(port))))
	if err != nil {
		return nil, err
	}
	return k.opts.Fabric.Serve(ln, k.opts.Cluster, wan.PodAddress, wan.To(net.JoinHostPort("127.0.0.1", strconv.Itoa(local))))
}
