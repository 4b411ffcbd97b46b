package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
	"github.com/fleetinfer/fleetinfer/hub/federation"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// hubCAOverlap is the suite hub's --federation-ca-rotation-overlap: longer
// than the local kubelet takes to sync a Secret volume (every 5 s) plus a
// picker's reload (every 1 s), with room for a busy machine.
const hubCAOverlap = 15 * time.Second

// Replacing the hub's federation CA re-signs every picker's certificate
// without a moment in which one picker, presenting the certificate the hub
// last published for it, is refused by another, or refuses it: the pickers
// first trust both CAs, then get certificates of the new one, and only then
// stop trusting the old one.
func TestHubRotatesTheFederationCAWithoutRefusingPeers(t *testing.T) {
	ns := namespace(t, fl.Hub)
	const name = "rotated"
	svc := gpuService(ns, name, 1, 1)
	svc.Spec.Router = &v1alpha2.RouterSpec{Scheduler: &v1alpha2.SchedulerSpec{}}
	place(t, svc, fleetv1alpha1.InferencePlacementSpec{Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east", "west"}}})
	hubReady(t, ns, name, "east=1,west=1", 120*time.Second)
	pickersConnected(t, ns, name, "east", "west")

	members := []string{"east", "west"}
	addr := map[string]string{}
	before := map[string]*corev1.Secret{}
	for _, m := range members {
		pod := pickerPod(t, fl.Spoke(m), ns, name)
		addr[m] = net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(fleetv1alpha1.FederationPort))
		s, err := federationSecret(context.Background(), m, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		before[m] = s
	}
	oldCA := before["east"].Data[corev1.ServiceAccountRootCAKey]

	// Throughout the rotation, each picker subscribes afresh to the other
	// with what the hub last published for it: its newest certificate
	// against the other's loaded trust, and the other's loaded certificate
	// against its newest trust.
	var (
		mu       sync.Mutex
		failures []string
		samples  int
	)
	stop, done := make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		for {
			for _, pair := range [][2]string{{"east", "west"}, {"west", "east"}} {
				err := subscribeWithPublished(ns, name, pair[0], addr[pair[1]])
				mu.Lock()
				if err != nil {
					failures = append(failures, fmt.Sprintf("%.1fs %s→%s: %v", time.Since(start).Seconds(), pair[0], pair[1], err))
				}
				samples++
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()

	ca, err := federationtest.NewCA("replacement federation CA")
	if err != nil {
		t.Fatal(err)
	}
	key, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "replace the CA", func(ctx context.Context) error {
		s := &corev1.Secret{}
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: fleet.Namespace, Name: "fleetinfer-federation-ca"}, s); err != nil {
			return err
		}
		s.Data = map[string][]byte{corev1.TLSCertKey: ca.PEM, corev1.TLSPrivateKeyKey: key}
		return fl.Hub.Client.Update(ctx, s)
	})
	rotated := time.Now()

	phase := func(what string, check func(m string, s *corev1.Secret) error) {
		t.Helper()
		testutil.Eventually(t, 60*time.Second, what, func(ctx context.Context) error {
			for _, m := range members {
				s, err := federationSecret(ctx, m, ns, name)
				if err != nil {
					return err
				}
				if err := check(m, s); err != nil {
					return fmt.Errorf("%s: %w", m, err)
				}
			}
			return nil
		})
		t.Logf("%s %.1fs after the CA was replaced", what, time.Since(rotated).Seconds())
	}
	both := append(append([]byte{}, ca.PEM...), oldCA...)
	phase("both CAs trusted, certificates kept", func(m string, s *corev1.Secret) error {
		if !bytes.Equal(s.Data[corev1.ServiceAccountRootCAKey], both) {
			return errors.New("ca.crt is not the new CA followed by the old one")
		}
		if !bytes.Equal(s.Data[corev1.TLSCertKey], before[m].Data[corev1.TLSCertKey]) {
			return errors.New("the certificate changed before every picker trusted the new CA")
		}
		return nil
	})
	phase("certificates of the new CA", func(_ string, s *corev1.Secret) error {
		if err := verifyLeaf(s.Data[corev1.TLSCertKey], ca.PEM); err != nil {
			return err
		}
		if !bytes.Equal(s.Data[corev1.ServiceAccountRootCAKey], both) {
			return errors.New("the old CA left the bundle as certificates were re-signed")
		}
		return nil
	})
	phase("the old CA dropped", func(_ string, s *corev1.Secret) error {
		if !bytes.Equal(s.Data[corev1.ServiceAccountRootCAKey], ca.PEM) {
			return errors.New("ca.crt is not the new CA alone")
		}
		return nil
	})
	// Let the pickers load the last files before the sampling stops.
	time.Sleep(hubCAOverlap)
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d fresh subscriptions over %.0fs", samples, time.Since(start).Seconds())
	if len(failures) > 0 {
		t.Fatalf("%d of %d subscriptions refused during the rotation: %v", len(failures), samples, failures)
	}
	if samples < 40 {
		t.Fatalf("only %d subscriptions sampled", samples)
	}
	pickersConnected(t, ns, name, "east", "west")
	testutil.Eventually(t, 10*time.Second, "events of the rotation on the hub service", func(ctx context.Context) error {
		var events corev1.EventList
		if err := fl.Hub.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == name {
				seen[e.Reason] = true
			}
		}
		if !seen[federation.ReasonTrustUpdated] || !seen[federation.ReasonCertificateIssued] {
			return fmt.Errorf("reasons %v, want %s and %s", seen, federation.ReasonTrustUpdated, federation.ReasonCertificateIssued)
		}
		return nil
	})
}

func federationSecret(ctx context.Context, cluster, ns, name string) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	err := fl.Spoke(cluster).Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: fleetv1alpha1.FederationTLSName(name)}, s)
	return s, err
}

// verifyLeaf verifies a client certificate (PEM) against a trust bundle.
func verifyLeaf(certPEM, bundle []byte) error {
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return errors.New("tls.crt holds no PEM block")
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(bundle)
	return verifyChain(b.Bytes, roots, x509.ExtKeyUsageClientAuth)
}

// verifyChain verifies a certificate (DER) for usage against roots, without
// a host name: pickers name each other by URI.
func verifyChain(der []byte, roots *x509.CertPool, usage x509.ExtKeyUsage) error {
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return err
	}
	_, err = leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

// subscribeWithPublished subscribes to the picker at addr with the
// certificate and trust bundle the hub published for from's picker, and
// returns how the first receive ended.
func subscribeWithPublished(ns, name, from, addr string) error {
	s, err := federationSecret(context.Background(), from, ns, name)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(s.Data[corev1.ServiceAccountRootCAKey])
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		InsecureSkipVerify: true, //nolint:gosec // verified below, as the picker does
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			return verifyChain(raw[0], roots, x509.ExtKeyUsageServerAuth)
		}}
	return subscribeOver(addr, cfg, ns, name+"-inference-pool")
}
