package hub

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// +kubebuilder:rbac:groups="",resources=namespaces,resourceNames=kube-system,verbs=get

// HubIdentity is the ID this hub marks its spoke objects with: the one given
// (--hub-id), or else the UID of the hub cluster's kube-system namespace,
// which no other cluster shares and which outlives hub restarts, upgrades
// and leader changes. Two hub clusters thus never claim each other's copies
// unless an operator says so, as a restore onto a new hub cluster must (give
// it the old hub's ID).
func HubIdentity(ctx context.Context, hub client.Reader, given string) (string, error) {
	if given != "" {
		if msgs := validation.IsValidLabelValue(given); len(msgs) > 0 {
			return "", fmt.Errorf("--hub-id %q is not a valid label value: %s", given, strings.Join(msgs, "; "))
		}
		return given, nil
	}
	uid, err := kubeSystemUID(ctx, hub)
	if err != nil {
		return "", fmt.Errorf("deriving the hub's identity (or set --hub-id): %w", err)
	}
	return uid, nil
}

// HubInstallation names this hub installation as the holder of its leases
// in the spokes (package fence): the hub cluster's kube-system UID and the
// hub's namespace there. Unlike the hub ID, which an operator may give two
// hubs, no other installation shares it, while every replica of this one
// does, so a new leader holds the leases at once.
func HubInstallation(ctx context.Context, hub client.Reader, namespace string) (string, error) {
	uid, err := kubeSystemUID(ctx, hub)
	if err != nil {
		return "", fmt.Errorf("naming the hub installation: %w", err)
	}
	return uid + "/" + namespace, nil
}

// kubeSystemUID is the UID of the hub cluster's kube-system namespace.
func kubeSystemUID(ctx context.Context, hub client.Reader) (string, error) {
	ns := &corev1.Namespace{}
	if err := hub.Get(ctx, client.ObjectKey{Name: metav1.NamespaceSystem}, ns); err != nil {
		return "", fmt.Errorf("reading the kube-system namespace: %w", err)
	}
	if ns.UID == "" {
		return "", fmt.Errorf("the kube-system namespace has no UID")
	}
	return string(ns.UID), nil
}
