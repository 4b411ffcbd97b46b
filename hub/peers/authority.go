package peers

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Lifetimes of what the authority signs. A leaf is renewed once less than a
// third of its life remains, so an endpoint picker that reloads its files
// every few seconds never holds an expired certificate.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 90 * 24 * time.Hour
	renewBefore  = leafValidity / 3
)

// +kubebuilder:rbac:groups="",resources=secrets,verbs=create

// Authority is the hub's federation CA: it signs each endpoint picker's
// certificate. Its key pair lives in a kubernetes.io/tls Secret on the hub;
// the hub creates one when the Secret is missing, and a platform team that
// wants its own CA (from cert-manager, say) puts it there instead.
type Authority struct {
	Client client.Client
	Secret client.ObjectKey

	mu      sync.Mutex
	version string // resourceVersion of the Secret the CA below came from
	cert    *x509.Certificate
	key     any
	pem     []byte
}

// load returns the CA, reading the Secret again only when it changed, and
// creating it when absent.
func (a *Authority) load(ctx context.Context) (*x509.Certificate, any, []byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := &corev1.Secret{}
	err := a.Client.Get(ctx, a.Secret, s)
	if apierrors.IsNotFound(err) {
		if s, err = a.create(ctx); err != nil {
			return nil, nil, nil, err
		}
	} else if err != nil {
		return nil, nil, nil, err
	}
	if s.ResourceVersion == a.version && a.cert != nil {
		return a.cert, a.key, a.pem, nil
	}
	cert, key, err := parsePair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, nil, nil, fmt.Errorf("federation CA Secret %s: %w", a.Secret, err)
	}
	if !cert.IsCA {
		return nil, nil, nil, fmt.Errorf("federation CA Secret %s: its certificate is not a CA", a.Secret)
	}
	a.version, a.cert, a.key, a.pem = s.ResourceVersion, cert, key, s.Data[corev1.TLSCertKey]
	return cert, key, a.pem, nil
}

func (a *Authority) create(ctx context.Context) (*corev1.Secret, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl, err := template("fleetinfer federation CA", time.Now().Add(caValidity))
	if err != nil {
		return nil, err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := encode(der, key)
	if err != nil {
		return nil, err
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: a.Secret.Namespace, Name: a.Secret.Name,
			Labels: map[string]string{"app.kubernetes.io/part-of": "fleetinfer"}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
	}
	if err := a.Client.Create(ctx, s); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create the federation CA Secret %s: %w", a.Secret, err)
		}
		// Another hub replica won; read the cache until it has theirs.
		err = a.Client.Get(ctx, a.Secret, s)
		return s, err
	}
	return s, nil
}

// issued is a certificate the authority signed.
type issued struct {
	cert, key, ca []byte
	renewAt       time.Time
}

// Issue signs a new certificate for identity (a URI such as a SPIFFE ID),
// usable for both ends of a federation stream.
func (a *Authority) Issue(ctx context.Context, identity string) (*issued, error) {
	caCert, caKey, caPEM, err := a.load(ctx)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(identity)
	if err != nil || u.Scheme == "" {
		return nil, fmt.Errorf("identity %q is not a URI", identity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl, err := template("fleetinfer-epp", time.Now().Add(leafValidity))
	if err != nil {
		return nil, err
	}
	tmpl.URIs = []*url.URL{u}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := encode(der, key)
	if err != nil {
		return nil, err
	}
	return &issued{cert: certPEM, key: keyPEM, ca: caPEM, renewAt: tmpl.NotAfter.Truncate(time.Second).Add(-renewBefore)}, nil
}

// Current checks a certificate the authority issued earlier: it is current
// when the CA still is the authority's, it names identity, and it is not due
// for renewal. It returns when renewal falls due.
func (a *Authority) Current(ctx context.Context, identity string, certPEM, caPEM []byte) (time.Time, bool, error) {
	caCert, _, current, err := a.load(ctx)
	if err != nil {
		return time.Time{}, false, err
	}
	if string(caPEM) != string(current) {
		return time.Time{}, false, nil
	}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return time.Time{}, false, nil
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil || leaf.CheckSignatureFrom(caCert) != nil {
		return time.Time{}, false, nil
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != identity {
		return time.Time{}, false, nil
	}
	renewAt := leaf.NotAfter.Add(-renewBefore)
	return renewAt, time.Now().Before(renewAt), nil
}

func parsePair(certPEM, keyPEM []byte) (*x509.Certificate, any, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("tls.crt and tls.key must hold PEM data")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		if key, err = x509.ParseECPrivateKey(kb.Bytes); err != nil {
			if key, err = x509.ParsePKCS1PrivateKey(kb.Bytes); err != nil {
				return nil, nil, errors.New("tls.key is not a PKCS#8, EC or PKCS#1 private key")
			}
		}
	}
	return cert, key, nil
}

func encode(der []byte, key *ecdsa.PrivateKey) (certPEM, keyPEM []byte, err error) {
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), nil
}

// template is a certificate template with a random 127-bit serial.
func template(subject string, notAfter time.Time) (*x509.Certificate, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	return &x509.Certificate{SerialNumber: n, Subject: pkix.Name{CommonName: subject},
		NotBefore: time.Now().Add(-5 * time.Minute), NotAfter: notAfter}, nil
}
