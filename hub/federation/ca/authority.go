// Package ca is the hub's federation certificate authority: it signs the
// mTLS certificate of every federated endpoint picker and rotates its own CA
// without breaking the streams between pickers (Authority).
package ca

import (
	"bytes"
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
	"slices"
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

// +kubebuilder:rbac:groups="",namespace=fleetinfer-system,resources=secrets,verbs=create;update

// Authority is the hub's federation CA: it signs each endpoint picker's
// certificate. Its key pair lives in a kubernetes.io/tls Secret on the hub;
// the hub creates one when the Secret is missing, and a platform team that
// wants its own CA (from cert-manager, say) puts it there instead.
//
// Replacing the CA rotates it without breaking streams between pickers,
// which verify each other against the trust bundle they were given. The
// bundle first grows to hold the new CA next to the old one while leaves of
// the old CA are kept; once every picker has had time to reload it, leaves
// are re-signed by the new CA; once those have reached every picker too, the
// old CA leaves the bundle. Each phase lasts Overlap. The old CA and the
// rotation's start are kept in a second Secret, <Secret>-trust, so that a
// restarted hub carries on where it was.
type Authority struct {
	Client client.Client
	// Reader reads without the cache; it confirms a rotation before the
	// trust Secret is written (default Client).
	Reader client.Reader
	Secret client.ObjectKey
	// Overlap is how long each phase of a rotation lasts: longer than it
	// takes an updated Secret to reach a picker's files and the picker to
	// reload them (default 10 minutes).
	Overlap time.Duration

	now     func() time.Time
	mu      sync.Mutex
	version string // resourceVersions of the Secrets the state below came from
	st      *caState
}

// caState is the CA and, during a rotation, the CA it replaced.
type caState struct {
	cert        *x509.Certificate
	key         any
	pem         []byte
	previous    *x509.Certificate
	previousPEM []byte
	rotatedAt   time.Time
}

// Keys of the trust Secret.
const (
	trustCurrentKey  = "ca.crt"
	trustPreviousKey = "previous.crt"
	trustRotatedKey  = "rotated-at"
)

// DefaultOverlap is each rotation phase's length when Overlap is unset.
const DefaultOverlap = 10 * time.Minute

func (a *Authority) clock() time.Time {
	if a.now != nil {
		return a.now()
	}
	return time.Now()
}

func (a *Authority) overlap() time.Duration {
	if a.Overlap > 0 {
		return a.Overlap
	}
	return DefaultOverlap
}

func (a *Authority) trustKey() client.ObjectKey {
	return client.ObjectKey{Namespace: a.Secret.Namespace, Name: a.Secret.Name + "-trust"}
}

// load returns the CA state, reading the Secrets again only when they
// changed, creating the CA when absent and recording a rotation when the CA
// is not the one the trust Secret last saw.
func (a *Authority) load(ctx context.Context) (*caState, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := &corev1.Secret{}
	err := a.Client.Get(ctx, a.Secret, s)
	if apierrors.IsNotFound(err) {
		if s, err = a.create(ctx); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	trust := &corev1.Secret{}
	if err := a.Client.Get(ctx, a.trustKey(), trust); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, err
		}
		trust = nil
	}
	if versionOf(s, trust) == a.version && a.st != nil {
		return a.st, nil
	}
	cert, key, err := parsePair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("federation CA Secret %s: %w", a.Secret, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("federation CA Secret %s: its certificate is not a CA", a.Secret)
	}
	st := &caState{cert: cert, key: key, pem: s.Data[corev1.TLSCertKey]}
	if trust == nil || !bytes.Equal(trust.Data[trustCurrentKey], st.pem) {
		// The cache may lag behind a write of ours: confirm before writing.
		if trust, err = a.recordRotation(ctx, st); err != nil {
			return nil, err
		}
	}
	if prev := trust.Data[trustPreviousKey]; len(prev) > 0 {
		b, _ := pem.Decode(prev)
		at, err := time.Parse(time.RFC3339Nano, string(trust.Data[trustRotatedKey]))
		if b == nil || err != nil {
			return nil, fmt.Errorf("federation trust Secret %s: previous.crt or rotated-at unreadable", a.trustKey())
		}
		if st.previous, err = x509.ParseCertificate(b.Bytes); err != nil {
			return nil, fmt.Errorf("federation trust Secret %s: %w", a.trustKey(), err)
		}
		st.previousPEM, st.rotatedAt = prev, at
	}
	a.version, a.st = versionOf(s, trust), st
	return st, nil
}

// versionOf names the state of the CA and trust Secrets (trust may be nil).
func versionOf(ca, trust *corev1.Secret) string {
	if trust == nil {
		return ca.ResourceVersion + "/"
	}
	return ca.ResourceVersion + "/" + trust.ResourceVersion
}

// recordRotation makes the trust Secret name st's CA as current, keeping the
// CA it named before as the previous one from now on.
func (a *Authority) recordRotation(ctx context.Context, st *caState) (*corev1.Secret, error) {
	reader := a.Reader
	if reader == nil {
		reader = a.Client
	}
	trust := &corev1.Secret{}
	err := reader.Get(ctx, a.trustKey(), trust)
	switch {
	case apierrors.IsNotFound(err):
		trust = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: a.Secret.Namespace, Name: a.trustKey().Name,
				Labels: map[string]string{"app.kubernetes.io/part-of": "fleetinfer"}},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{trustCurrentKey: st.pem},
		}
		if err := a.Client.Create(ctx, trust); err != nil {
			return nil, fmt.Errorf("create the federation trust Secret %s: %w", a.trustKey(), err)
		}
		return trust, nil
	case err != nil:
		return nil, err
	case bytes.Equal(trust.Data[trustCurrentKey], st.pem):
		return trust, nil
	}
	trust.Data = map[string][]byte{trustCurrentKey: st.pem, trustPreviousKey: trust.Data[trustCurrentKey],
		trustRotatedKey: []byte(a.clock().UTC().Format(time.RFC3339Nano))}
	if err := a.Client.Update(ctx, trust); err != nil {
		return nil, fmt.Errorf("record the federation CA rotation in %s: %w", a.trustKey(), err)
	}
	return trust, nil
}

// phase is where a rotation stands at one time.
type phase struct {
	// bundle is the trust bundle every picker holds: the CA, then the
	// previous one while it is still trusted.
	bundle []byte
	// keepPrevious reports whether leaves of the previous CA are still
	// kept; once not, they are re-signed.
	keepPrevious bool
	// next is when the phase ends (zero without a rotation).
	next time.Time
}

func (st *caState) at(now time.Time, overlap time.Duration) phase {
	end := st.rotatedAt.Add(2 * overlap)
	if st.previous == nil || !now.Before(end) || now.After(st.previous.NotAfter) {
		return phase{bundle: st.pem}
	}
	p := phase{bundle: append(slices.Clip(st.pem), st.previousPEM...), next: end}
	if switchAt := st.rotatedAt.Add(overlap); now.Before(switchAt) {
		p.keepPrevious, p.next = true, switchAt
	}
	return p
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

// Issued is a certificate the authority signed.
type Issued struct {
	// Cert and Key are the PEM certificate and its PKCS#8 key; Bundle is
	// the trust bundle the holder verifies its peers against.
	Cert, Key, Bundle []byte
	// Recheck is when the certificate is due for renewal, or earlier when
	// a rotation's phase ends.
	Recheck time.Time
}

// Issue signs a new certificate for identity (a URI such as a SPIFFE ID),
// usable for both ends of a federation stream.
func (a *Authority) Issue(ctx context.Context, identity string) (*Issued, error) {
	st, err := a.load(ctx)
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, st.cert, &key.PublicKey, st.key)
	if err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := encode(der, key)
	if err != nil {
		return nil, err
	}
	ph := st.at(a.clock(), a.overlap())
	return &Issued{Cert: certPEM, Key: keyPEM, Bundle: ph.bundle, Recheck: earliest(tmpl.NotAfter.Truncate(time.Second).Add(-renewBefore), ph.next)}, nil
}

// Verdict is what a picker's certificate Secret needs.
type Verdict struct {
	// KeepLeaf reports that its certificate may stay: it names the
	// identity, is signed by a CA whose leaves are kept now, and is not due
	// for renewal. Otherwise a new one is issued.
	KeepLeaf bool
	// Bundle is the trust bundle its ca.crt must hold.
	Bundle []byte
	// Recheck is when the verdict may change: renewal, or the end of a
	// rotation's phase.
	Recheck time.Time
}

// Check judges a certificate the authority issued earlier.
func (a *Authority) Check(ctx context.Context, identity string, certPEM []byte) (Verdict, error) {
	st, err := a.load(ctx)
	if err != nil {
		return Verdict{}, err
	}
	ph := st.at(a.clock(), a.overlap())
	v := Verdict{Bundle: ph.bundle}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return v, nil
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil || len(leaf.URIs) != 1 || leaf.URIs[0].String() != identity {
		return v, nil
	}
	if leaf.CheckSignatureFrom(st.cert) != nil &&
		!(ph.keepPrevious && leaf.CheckSignatureFrom(st.previous) == nil) {
		return v, nil
	}
	renewAt := leaf.NotAfter.Add(-renewBefore)
	v.KeepLeaf, v.Recheck = a.clock().Before(renewAt), earliest(renewAt, ph.next)
	return v, nil
}

// earliest is the earlier of two times, a zero time counting as never.
func earliest(a, b time.Time) time.Time {
	if b.IsZero() || a.Before(b) {
		return a
	}
	return b
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
