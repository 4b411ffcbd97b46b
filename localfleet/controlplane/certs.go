package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// authority is a throwaway certificate authority for one control plane. It
// signs the API server's serving certificate and client certificates for any
// user, which is how the fleet hands out identities (controllers, kubelets,
// the hub's view of a spoke) without a static token file.
type authority struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

func newAuthority(name string) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name + "-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key, certPEM: pemBlock("CERTIFICATE", der)}, nil
}

// keyPair is a PEM certificate and key.
type keyPair struct {
	Cert []byte
	Key  []byte
}

func (a *authority) issue(subject pkix.Name, ips []net.IP, dnsNames []string, usage x509.ExtKeyUsage) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	sn, err := serial()
	if err != nil {
		return keyPair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
		DNSNames:     dnsNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, key.Public(), a.key)
	if err != nil {
		return keyPair{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{Cert: pemBlock("CERTIFICATE", der), Key: pemBlock("PRIVATE KEY", keyDER)}, nil
}

// serving issues a TLS server certificate for the given loopback host and
// any further addresses it is reached at.
func (a *authority) serving(host string, more ...net.IP) (keyPair, error) {
	ip := net.ParseIP(host)
	if ip == nil {
		return keyPair{}, fmt.Errorf("serving address %q is not an IP", host)
	}
	return a.issue(pkix.Name{CommonName: "kube-apiserver"}, append([]net.IP{ip}, more...), []string{"localhost"}, x509.ExtKeyUsageServerAuth)
}

// client issues a client certificate; the API server maps CN to the user name
// and O to its groups.
func (a *authority) client(user string, groups []string) (keyPair, error) {
	return a.issue(pkix.Name{CommonName: user, Organization: groups}, nil, nil, x509.ExtKeyUsageClientAuth)
}

// signingKey returns a fresh private key and its public key in PEM, for
// service-account token signing.
func signingKey() (private, public []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("PRIVATE KEY", der), pemBlock("PUBLIC KEY", pub), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
}

// ServingCert issues a TLS server certificate for ip from a throwaway CA of
// its own, for a server the API server calls (a webhook): the configuration
// that points at it carries caPEM as its caBundle.
func ServingCert(name string, ip net.IP) (caPEM, certPEM, keyPEM []byte, err error) {
	ca, err := newAuthority(name)
	if err != nil {
		return nil, nil, nil, err
	}
	kp, err := ca.issue(pkix.Name{CommonName: name}, []net.IP{ip}, nil, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, nil, nil, err
	}
	return ca.certPEM, kp.Cert, kp.Key, nil
}
