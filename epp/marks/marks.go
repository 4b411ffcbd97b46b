// Package marks names and checks the marks a Parent-mode pick puts on the
// request it forwards to another cluster's gateway, and the proof that
// another cluster's picker set them.
//
// # The marks
//
// When the entry cluster's picker picks a pod of a Parent-mode peer, it
// sends the request to that cluster's gateway (x-gateway-destination-endpoint)
// and adds, by ext-proc header mutation on the request-headers response, the
// request headers Origin (its cluster), Hops (1), Pod (the chosen pods'
// ip:port, comma-separated; may be empty), Expires (unix seconds, Lifetime
// ahead), Cert (its federation certificate chain, base64 DER, leaf first,
// comma-separated) and Signature. Any gateway that speaks the Endpoint
// Picker Protocol carries them: they are plain request headers.
//
// The receiving picker verifies them (Verifier). A verified mark makes it
// pick among its local pods only, preferring the named pod, so a request
// crosses at most one cluster boundary. Marks that do not verify are treated
// as absent: they never steer a pick, so a client cannot forge them on a
// public listener.
//
// # The signature
//
// Signature is an ECDSA P-256 signature (ASN.1, base64) over the SHA-256 of
// a canonical encoding of (origin cluster, pool namespace, pool name, pods,
// hops, expiry): a version tag, then each field as a 4-byte big-endian
// length and its bytes. The key is the origin picker's federation private
// key, the one behind the certificate the hub issued it for its federation
// streams. The pool is not a header: the verifier puts its own, so a mark
// made for another pool does not verify.
//
// # The origin's public key
//
// It travels in the Cert header rather than coming from the federation
// stream, so that a mark verifies whatever the state of the receiver's own
// subscription to the origin, and needs no new field in the federation
// protocol. The receiver trusts it as it trusts a federation peer: the chain
// must verify against its current CA bundle (client authentication usage),
// and the leaf must carry the identity its peer directory lists for the
// Origin cluster of its pool. Chains that verified are cached by the
// SHA-256 of the header value, per CA bundle, so the chain check runs once
// per certificate, not per request; the identity, validity period and
// signature are checked on every request. A mark can be replayed until it
// expires, but all a replay obtains is what the origin already chose: a pick
// among that pool's local pods in that cluster.
package marks

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/fleetinfer/fleetinfer/epp/federation"
)

// The mark headers, lower case as ext-proc carries them.
const (
	Origin    = "x-fleetinfer-origin"
	Hops      = "x-fleetinfer-hops"
	Pod       = "x-fleetinfer-pod"
	Expires   = "x-fleetinfer-expires"
	Cert      = "x-fleetinfer-cert"
	Signature = "x-fleetinfer-mark"
)

// Headers are all the mark headers.
var Headers = []string{Origin, Hops, Pod, Expires, Cert, Signature}

const (
	// Lifetime is how long after signing a mark verifies.
	Lifetime = 30 * time.Second
	// MaxHops is the hop limit: a marked request is served where it lands.
	MaxHops = 1
	// maxAhead bounds how far in the future an expiry may lie, allowing for
	// clock skew between clusters.
	maxAhead = Lifetime + time.Minute
	// maxCached bounds the verified chains kept.
	maxCached = 256
	version   = "fleetinfer-parent-mark/v1"
)

// Mark is what the headers say.
type Mark struct {
	Origin string
	// Pool is the pool the mark was made for; not a header.
	Pool types.NamespacedName
	// Pods is the Pod header: ip:port, comma-separated; empty for none.
	Pods    string
	Hops    int
	Expires int64
}

// PodList returns the named pods.
func (m Mark) PodList() []string {
	var out []string
	for _, p := range strings.Split(m.Pods, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func (m Mark) digest() []byte {
	h := sha256.New()
	var n [4]byte
	for _, f := range []string{version, m.Origin, m.Pool.Namespace, m.Pool.Name, m.Pods,
		strconv.Itoa(m.Hops), strconv.FormatInt(m.Expires, 10)} {
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return h.Sum(nil)
}

// Sign returns the headers of m, signed with cert's private key, which must
// be ECDSA P-256, in the order of Headers.
func Sign(m Mark, cert *tls.Certificate) ([][2]string, error) {
	if cert == nil || len(cert.Certificate) == 0 {
		return nil, errors.New("marks: no certificate")
	}
	key, ok := cert.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("marks: the private key cannot sign")
	}
	if pub, ok := key.Public().(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		return nil, errors.New("marks: the federation key is not ECDSA P-256")
	}
	sig, err := key.Sign(rand.Reader, m.digest(), crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("marks: %w", err)
	}
	chain := make([]string, len(cert.Certificate))
	for i, der := range cert.Certificate {
		chain[i] = base64.StdEncoding.EncodeToString(der)
	}
	return [][2]string{
		{Origin, m.Origin}, {Hops, strconv.Itoa(m.Hops)}, {Pod, m.Pods},
		{Expires, strconv.FormatInt(m.Expires, 10)}, {Cert, strings.Join(chain, ",")},
		{Signature, base64.StdEncoding.EncodeToString(sig)},
	}, nil
}

// ErrAbsent is Verify's error for a request without any mark header.
var ErrAbsent = errors.New("no marks")

// Verifier checks the marks of requests to one pool's picker. Its fields
// are read on every call, so they follow reloaded files.
type Verifier struct {
	Pool types.NamespacedName
	// Roots returns the current CA bundle.
	Roots func() *x509.CertPool
	// Identity returns the identity the peer directory lists for a cluster
	// of the pool; false for an unknown cluster (and for this one).
	Identity func(cluster string) (string, bool)
	// Now defaults to time.Now.
	Now func() time.Time

	mu    sync.Mutex
	cache map[[32]byte]verified
}

// verified is a chain that verified against roots.
type verified struct {
	roots *x509.CertPool
	leaf  *x509.Certificate
	pub   *ecdsa.PublicKey
}

// Verify checks the mark headers get returns (ok is false for a header the
// request does not carry). It returns ErrAbsent when there are none, and
// another error, saying why, when they do not prove a mark.
func (v *Verifier) Verify(get func(name string) (string, bool)) (Mark, error) {
	var val [6]string
	present := false
	for i, name := range Headers {
		var ok bool
		val[i], ok = get(name)
		present = present || ok
	}
	if !present {
		return Mark{}, ErrAbsent
	}
	origin, hops, pods, expires, chain, sig := val[0], val[1], val[2], val[3], val[4], val[5]
	if origin == "" || hops == "" || expires == "" || chain == "" || sig == "" {
		return Mark{}, errors.New("incomplete: origin, hops, expiry, certificate and signature are required")
	}
	m := Mark{Origin: origin, Pool: v.Pool, Pods: pods}
	var err error
	if m.Hops, err = strconv.Atoi(hops); err != nil || m.Hops < 1 || m.Hops > MaxHops {
		return Mark{}, fmt.Errorf("hop count %q: the limit is %d", hops, MaxHops)
	}
	if m.Expires, err = strconv.ParseInt(expires, 10, 64); err != nil {
		return Mark{}, fmt.Errorf("expiry %q is not unix seconds", expires)
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	t := now()
	switch exp := time.Unix(m.Expires, 0); {
	case t.After(exp):
		return Mark{}, fmt.Errorf("expired at %s", exp.UTC().Format(time.RFC3339))
	case exp.Sub(t) > maxAhead:
		return Mark{}, fmt.Errorf("expiry %s is too far ahead", exp.UTC().Format(time.RFC3339))
	}
	identity, ok := v.Identity(origin)
	if !ok {
		return Mark{}, fmt.Errorf("origin cluster %q is not a peer of pool %s", origin, v.Pool)
	}
	c, err := v.chain(chain)
	if err != nil {
		return Mark{}, err
	}
	if t.Before(c.leaf.NotBefore) || t.After(c.leaf.NotAfter) {
		return Mark{}, errors.New("the origin's certificate is outside its validity period")
	}
	if !federation.HasIdentity(c.leaf, identity) {
		return Mark{}, fmt.Errorf("the origin's certificate is not for %q, the identity of cluster %q", identity, origin)
	}
	rawSig, err := base64.StdEncoding.DecodeString(sig)
	if err != nil || !ecdsa.VerifyASN1(c.pub, m.digest(), rawSig) {
		return Mark{}, errors.New("the signature does not verify (forged, altered, or made for another pool)")
	}
	return m, nil
}

// chain returns the verified chain of a Cert header value, from the cache
// when it verified against the current roots before.
func (v *Verifier) chain(value string) (verified, error) {
	fp := sha256.Sum256([]byte(value))
	roots := v.Roots()
	v.mu.Lock()
	c, ok := v.cache[fp]
	v.mu.Unlock()
	if ok && c.roots == roots {
		return c, nil
	}
	var certs []*x509.Certificate
	for _, part := range strings.Split(value, ",") {
		der, err := base64.StdEncoding.DecodeString(strings.TrimSpace(part))
		if err != nil {
			return verified{}, errors.New("the certificate is not base64")
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return verified{}, fmt.Errorf("the certificate does not parse: %w", err)
		}
		certs = append(certs, cert)
	}
	inter := x509.NewCertPool()
	for _, cert := range certs[1:] {
		inter.AddCert(cert)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return verified{}, fmt.Errorf("the origin's certificate does not verify against the CA bundle: %w", err)
	}
	pub, ok := certs[0].PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return verified{}, errors.New("the origin's key is not ECDSA P-256")
	}
	c = verified{roots: roots, leaf: certs[0], pub: pub}
	v.mu.Lock()
	if v.cache == nil || len(v.cache) >= maxCached {
		v.cache = map[[32]byte]verified{}
	}
	v.cache[fp] = c
	v.mu.Unlock()
	return c, nil
}
