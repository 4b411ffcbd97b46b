package ca

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/internal/testutil/testenv"
)

// The authority keeps its CA in a Secret of a real API server.
var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{Scheme: clientgoscheme.Scheme}, &env))
}

func leaf(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	if b == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAuthorityCreatesItsCAOnceAndIssuesCertificatesItRecognises(t *testing.T) {
	ctx := context.Background()
	key := client.ObjectKey{Namespace: testutil.NewNamespace(t, env.Client), Name: "federation-ca"}
	a := &Authority{Client: env.Client, Secret: key}
	const id = "spiffe://fleetinfer.io/cluster/east/ns/team/llminferenceservice/llama"
	got, err := a.Issue(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ca := &corev1.Secret{}
	if err := env.Client.Get(ctx, key, ca); err != nil {
		t.Fatalf("the CA Secret was not created: %v", err)
	}
	if ca.Type != corev1.SecretTypeTLS || string(ca.Data[corev1.TLSCertKey]) != string(got.Bundle) {
		t.Errorf("CA Secret type %s; its certificate is not the bundle issued with the leaf", ca.Type)
	}

	// The leaf chains to the CA, names the identity and serves both ends.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(got.Bundle)
	l := leaf(t, got.Cert)
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := l.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("leaf does not verify for %v: %v", usage, err)
		}
	}
	if len(l.URIs) != 1 || l.URIs[0].String() != id {
		t.Errorf("leaf URIs %v, want %s", l.URIs, id)
	}

	// A second hub replica uses the same CA rather than making its own.
	b := &Authority{Client: env.Client, Secret: key}
	v, err := b.Check(ctx, id, got.Cert)
	if err != nil || !v.KeepLeaf || !v.Recheck.Equal(got.Recheck) || string(v.Bundle) != string(got.Bundle) {
		t.Errorf("Check on a fresh certificate = %+v, %v; want kept until %v with the CA as bundle", v, err, got.Recheck)
	}
	if v, _ := b.Check(ctx, strings.Replace(id, "east", "west", 1), got.Cert); v.KeepLeaf {
		t.Error("a certificate for east is kept for west")
	}
	if v, _ := b.Check(ctx, id, []byte("not PEM")); v.KeepLeaf {
		t.Error("garbage is kept as a certificate")
	}
}

// replaceCA puts a new CA into the authority's Secret, as a platform team
// bringing its own would, and returns its certificate.
func replaceCA(t *testing.T, key client.ObjectKey) []byte {
	t.Helper()
	ctx := context.Background()
	scratch := &Authority{Client: env.Client, Secret: client.ObjectKey{Namespace: key.Namespace, Name: key.Name + "-scratch"}}
	st, err := scratch.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fresh := &corev1.Secret{}
	if err := env.Client.Get(ctx, scratch.Secret, fresh); err != nil {
		t.Fatal(err)
	}
	cur := &corev1.Secret{}
	if err := env.Client.Get(ctx, key, cur); err != nil {
		t.Fatal(err)
	}
	cur.Data = fresh.Data
	if err := env.Client.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	return st.pem
}

func verifies(t *testing.T, certPEM, bundle []byte) bool {
	t.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		t.Fatal("bundle holds no certificate")
	}
	_, err := leaf(t, certPEM).Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err == nil
}

// Replacing the CA never leaves two pickers unable to verify each other:
// first every picker trusts both CAs and keeps its certificate, then
// certificates are re-signed by the new CA, and only then is the old CA
// dropped. A hub restarted in between carries on where it was.
func TestAuthorityRotatesTheCAWithAnOverlap(t *testing.T) {
	ctx := context.Background()
	key := client.ObjectKey{Namespace: testutil.NewNamespace(t, env.Client), Name: "federation-ca"}
	clock := time.Now()
	const overlap = 10 * time.Minute
	newAuthority := func() *Authority {
		return &Authority{Client: env.Client, Secret: key, Overlap: overlap, now: func() time.Time { return clock }}
	}
	a := newAuthority()
	const east, west = "spiffe://fleetinfer.io/cluster/east/x", "spiffe://fleetinfer.io/cluster/west/x"
	oldEast, err := a.Issue(ctx, east)
	if err != nil {
		t.Fatal(err)
	}
	oldCA := oldEast.Bundle

	rotatedAt := clock
	newCA := replaceCA(t, key)
	var v Verdict
	// Phase 1: the bundle holds both CAs; the old leaf is kept; a leaf
	// issued now is signed by the new CA and verifies against the bundle the
	// old leaf's holder gets, and the old leaf against the new holder's.
	testutil.Eventually(t, 10*time.Second, "the bundle grows to both CAs", func(ctx context.Context) error {
		if v, err = a.Check(ctx, east, oldEast.Cert); err != nil || string(v.Bundle) != string(newCA)+string(oldCA) {
			return fmt.Errorf("verdict %+v, %v", v, err)
		}
		return nil
	})
	if !v.KeepLeaf || !v.Recheck.Equal(rotatedAt.Add(overlap)) {
		t.Fatalf("phase 1: %+v; want the old leaf kept until %v", v, rotatedAt.Add(overlap))
	}
	newWest, err := a.Issue(ctx, west)
	if err != nil {
		t.Fatal(err)
	}
	if !verifies(t, newWest.Cert, v.Bundle) || !verifies(t, oldEast.Cert, newWest.Bundle) || verifies(t, newWest.Cert, oldCA) {
		t.Fatal("phase 1: the new leaf is not signed by the new CA, or either leaf does not verify against the bundle")
	}

	// A restarted hub sees the same rotation.
	clock = rotatedAt.Add(overlap + time.Second)
	a = newAuthority()
	// Phase 2: leaves of the old CA are re-signed; the bundle keeps both.
	v, err = a.Check(ctx, east, oldEast.Cert)
	if err != nil || v.KeepLeaf || string(v.Bundle) != string(newCA)+string(oldCA) {
		t.Fatalf("phase 2: %+v, %v; want the old leaf replaced, both CAs trusted", v, err)
	}
	if v, _ := a.Check(ctx, west, newWest.Cert); !v.KeepLeaf || !v.Recheck.Equal(rotatedAt.Add(2*overlap)) {
		t.Fatalf("phase 2: a leaf of the new CA %+v; want kept, rechecked at %v", v, rotatedAt.Add(2*overlap))
	}

	// Done: only the new CA is trusted.
	clock = rotatedAt.Add(2*overlap + time.Second)
	v, err = a.Check(ctx, west, newWest.Cert)
	if err != nil || !v.KeepLeaf || string(v.Bundle) != string(newCA) {
		t.Fatalf("after the rotation: %+v, %v; want the new leaf kept and the new CA alone", v, err)
	}
}

func TestAuthorityRefusesACASecretThatHoldsNoCA(t *testing.T) {
	ctx := context.Background()
	ns := testutil.NewNamespace(t, env.Client)
	// A leaf certificate is not a CA.
	issuer := &Authority{Client: env.Client, Secret: client.ObjectKey{Namespace: ns, Name: "issuer"}}
	l, err := issuer.Issue(ctx, "spiffe://fleetinfer.io/x")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]map[string][]byte{
		"leaf":    {corev1.TLSCertKey: l.Cert, corev1.TLSPrivateKeyKey: l.Key},
		"garbage": {corev1.TLSCertKey: []byte("x"), corev1.TLSPrivateKeyKey: []byte("y")},
	} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeOpaque, Data: data}
		if err := env.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		a := &Authority{Client: env.Client, Secret: client.ObjectKeyFromObject(s)}
		_, err := a.Issue(ctx, "spiffe://fleetinfer.io/y")
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("federation CA Secret %s/%s", ns, name)) {
			t.Errorf("%s: error %v, want one naming the Secret", name, err)
		}
	}
}
