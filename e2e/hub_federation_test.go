package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fedpool"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// pickerPod is the ready endpoint-picker pod of a service in a spoke.
func pickerPod(t *testing.T, c *fleet.Cluster, ns, svc string) corev1.Pod {
	t.Helper()
	return readyPod(t, c, ns, map[string]string{"app.kubernetes.io/name": svc,
		"app.kubernetes.io/component": "llminferenceservice-router-scheduler"})
}

// directory reads the peer directory the hub published next to a copy.
func directory(ctx context.Context, c *fleet.Cluster, ns, svc string) (*fleetv1alpha1.PeerDirectory, error) {
	cm := &corev1.ConfigMap{}
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: fleetv1alpha1.PeerDirectoryName(svc)}, cm); err != nil {
		return nil, err
	}
	return fleetv1alpha1.ParsePeerDirectory([]byte(cm.Data[fleetv1alpha1.PeerDirectoryKey]))
}

// pickersConnected waits for each member's picker of service ns/name to
// hold a stream to every other member and their pods.
func pickersConnected(t *testing.T, ns, name string, members ...string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "pickers connected", func(ctx context.Context) error {
		for _, m := range members {
			pod := pickerPod(t, fl.Spoke(m), ns, name)
			got, err := fedpool.EPPMetrics(ctx, pod)
			if err != nil {
				return fmt.Errorf("%s: %w", m, err)
			}
			if n := got["fleetinfer_epp_federation_peers_connected"]; int(n) != len(members)-1 {
				return fmt.Errorf("%s's picker has %v peers connected, want %d", m, n, len(members)-1)
			}
			for _, o := range members {
				if o == m {
					continue
				}
				if n := got[fmt.Sprintf("fleetinfer_epp_federation_remote_endpoints{peer=%q}", o)]; n != 1 {
					return fmt.Errorf("%s's picker holds %v endpoints of %s, want 1", m, n, o)
				}
			}
		}
		return nil
	})
}

// A service placed on several spokes gets federated endpoint pickers without
// anyone writing a peer list or a certificate: the hub publishes to each
// cluster a directory of the other clusters' pickers and an mTLS certificate
// from its CA, the pickers connect to each other and hold each other's pods,
// and the directories follow the placement when it narrows.
func TestHubFederatesTheEndpointPickersOfAPlacedService(t *testing.T) {
	ns := namespace(t, fl.Hub)
	const name = "federated"
	svc := gpuService(ns, name, 1, 1)
	// Routed through each spoke's default Gateway, whose address the spoke
	// reports on the copy for Parent mode.
	svc.Spec.Router = &v1alpha2.RouterSpec{Scheduler: &v1alpha2.SchedulerSpec{},
		Route: &v1alpha2.GatewayRoutesSpec{}, Gateway: &v1alpha2.GatewaySpec{}}
	p := place(t, svc, fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east", "west", "central"}},
		// Parent mode: peers carry their gateway's address.
		Federation: fleetv1alpha1.Federation{Mode: fleetv1alpha1.FederationParent},
	})
	hubReady(t, ns, name, "central=1,east=1,west=1", 120*time.Second)

	// want checks every member's directory against the members' pickers.
	want := func(members ...string) {
		t.Helper()
		testutil.Eventually(t, 60*time.Second, "peer directories of "+strings.Join(members, "+"), func(ctx context.Context) error {
			// Each picker is reached at its federation LoadBalancer Service's
			// address: pod addresses do not cross clusters.
			addr := map[string]string{}
			for _, m := range members {
				lb := &corev1.Service{}
				if err := fl.Spoke(m).Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: fleetv1alpha1.FederationServiceName(name)}, lb); err != nil {
					return fmt.Errorf("%s: %w", m, err)
				}
				if len(lb.Status.LoadBalancer.Ingress) == 0 {
					return fmt.Errorf("%s: the federation Service has no load-balancer address yet", m)
				}
				addr[m] = net.JoinHostPort(lb.Status.LoadBalancer.Ingress[0].IP, strconv.Itoa(fleetv1alpha1.FederationPort))
			}
			for _, m := range members {
				d, err := directory(ctx, fl.Spoke(m), ns, name)
				if err != nil {
					return fmt.Errorf("%s: %w", m, err)
				}
				var got []string
				for _, peer := range d.Peers {
					got = append(got, peer.Cluster)
					wantID := fmt.Sprintf("spiffe://fleetinfer.io/cluster/%s/ns/%s/llminferenceservice/%s", peer.Cluster, ns, name)
					gw := strings.TrimPrefix(fl.Spoke(peer.Cluster).GatewayURL(), "http://")
					if peer.FederationAddress != addr[peer.Cluster] || peer.Identity != wantID || peer.GatewayAddress != gw || peer.Mode != fleetv1alpha1.FederationParent {
						return fmt.Errorf("%s lists %+v; want %s, %s, gateway %s, Parent", m, peer, addr[peer.Cluster], wantID, gw)
					}
				}
				others := slices.DeleteFunc(slices.Clone(members), func(s string) bool { return s == m })
				slices.Sort(others)
				if !slices.Equal(got, others) {
					return fmt.Errorf("%s lists %v, want %v", m, got, others)
				}
			}
			return nil
		})
	}
	want("central", "east", "west")
	pickersConnected(t, ns, name, "central", "east", "west")

	// Each picker's certificate names its own cluster, signed by the hub's CA.
	sec, err := federationSecret(context.Background(), "east", ns, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, corev1.ServiceAccountRootCAKey} {
		if len(sec.Data[k]) == 0 {
			t.Errorf("east's federation Secret has no %s", k)
		}
	}

	testutil.Eventually(t, 10*time.Second, "narrow placement", func(ctx context.Context) error {
		if err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
		p.Spec.Clusters.Names = []string{"east", "west"}
		return fl.Hub.Client.Update(ctx, p)
	})
	hubReady(t, ns, name, "east=1,west=1", 60*time.Second)
	want("east", "west")
	pickersConnected(t, ns, name, "east", "west")

	// Stopping the service removes its pickers, and with them what the hub
	// published for them; starting it again publishes afresh.
	setStopped := func(stopped string) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, "annotate "+v1alpha2.StopAnnotation+"="+stopped, func(ctx context.Context) error {
			cur := &v1alpha2.LLMInferenceService{}
			if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cur); err != nil {
				return err
			}
			if cur.Annotations == nil {
				cur.Annotations = map[string]string{}
			}
			cur.Annotations[v1alpha2.StopAnnotation] = stopped
			return fl.Hub.Client.Update(ctx, cur)
		})
	}
	setStopped("true")
	testutil.Eventually(t, 30*time.Second, "federation objects removed from stopped copies", func(ctx context.Context) error {
		for _, m := range []string{"east", "west"} {
			if _, err := directory(ctx, fl.Spoke(m), ns, name); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s: peer directory still there (%v)", m, err)
			}
			if _, err := federationSecret(ctx, m, ns, name); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s: certificate still there (%v)", m, err)
			}
		}
		return nil
	})
	setStopped("false")
	want("east", "west")
	pickersConnected(t, ns, name, "east", "west")
}
