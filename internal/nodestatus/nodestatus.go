// Package nodestatus reads Node objects the way both fleetinfer's spoke
// controller (what capacity a cluster has) and the local fleet's kubelet
// (whether its node status must be posted again) need to.
package nodestatus

import corev1 "k8s.io/api/core/v1"

// Ready reports whether the node's Ready condition is True; a node that
// reports none is not ready.
func Ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
