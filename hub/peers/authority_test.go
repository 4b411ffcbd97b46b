package peers

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetinfer/fleetinfer/e2e/testenv"
)

// The authority keeps its CA in a Secret of a real API server.
var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{Scheme: clientgoscheme.Scheme}, &env))
}

func testNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "authority-"}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
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
	key := client.ObjectKey{Namespace: testNamespace(t), Name: "federation-ca"}
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
	if ca.Type != corev1.SecretTypeTLS || string(ca.Data[corev1.TLSCertKey]) != string(got.ca) {
		t.Errorf("CA Secret type %s; its certificate is not the bundle issued with the leaf", ca.Type)
	}

	// The leaf chains to the CA, names the identity and serves both ends.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(got.ca)
	l := leaf(t, got.cert)
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
	renewAt, ok, err := b.Current(ctx, id, got.cert, got.ca)
	if err != nil || !ok || !renewAt.Equal(got.renewAt) {
		t.Errorf("Current on a fresh certificate = %v, %v, %v; want true at %v", renewAt, ok, err, got.renewAt)
	}
	if _, ok, _ := b.Current(ctx, strings.Replace(id, "east", "west", 1), got.cert, got.ca); ok {
		t.Error("a certificate for east is current for west")
	}
	if _, ok, _ := b.Current(ctx, id, []byte("not PEM"), got.ca); ok {
		t.Error("garbage is a current certificate")
	}
}

func TestAuthorityReissuesWhenTheCAIsReplaced(t *testing.T) {
	ctx := context.Background()
	key := client.ObjectKey{Namespace: testNamespace(t), Name: "federation-ca"}
	a := &Authority{Client: env.Client, Secret: key}
	const id = "spiffe://fleetinfer.io/cluster/east/ns/team/llminferenceservice/llama"
	old, err := a.Issue(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// A platform team brings its own CA: the old leaves are no longer current.
	if err := env.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}); err != nil {
		t.Fatal(err)
	}
	other := &Authority{Client: env.Client, Secret: client.ObjectKey{Namespace: key.Namespace, Name: "scratch"}}
	if _, err := other.Issue(ctx, id); err != nil {
		t.Fatal(err)
	}
	own := &corev1.Secret{}
	if err := env.Client.Get(ctx, other.Secret, own); err != nil {
		t.Fatal(err)
	}
	mine := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Type: corev1.SecretTypeTLS, Data: own.Data}
	if err := env.Client.Create(ctx, mine); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := a.Current(ctx, id, old.cert, old.ca); err != nil || ok {
		t.Fatalf("a leaf of the replaced CA is current (%v, %v)", ok, err)
	}
	fresh, err := a.Issue(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if string(fresh.ca) != string(own.Data[corev1.TLSCertKey]) {
		t.Error("the new leaf is not signed by the team's CA")
	}
}

func TestAuthorityRefusesACASecretThatHoldsNoCA(t *testing.T) {
	ctx := context.Background()
	ns := testNamespace(t)
	// A leaf certificate is not a CA.
	issuer := &Authority{Client: env.Client, Secret: client.ObjectKey{Namespace: ns, Name: "issuer"}}
	l, err := issuer.Issue(ctx, "spiffe://fleetinfer.io/x")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]map[string][]byte{
		"leaf":    {corev1.TLSCertKey: l.cert, corev1.TLSPrivateKeyKey: l.key},
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
