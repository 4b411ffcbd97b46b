package federation

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// TLSFiles are the PEM files of an EPP's federation identity: its
// certificate and key, and the CA bundle that signs its peers' certificates.
type TLSFiles struct {
	CertFile, KeyFile, CAFile string
}

// Credentials holds the current certificate and CA pool, reloaded from
// their files when they change, so rotating a Secret takes effect on the
// next handshake without a restart.
type Credentials struct {
	files TLSFiles
	log   logr.Logger

	mu      sync.RWMutex
	cert    *tls.Certificate
	pool    *x509.CertPool
	raw     [3][]byte
	changes changes
}

// Changed returns a channel that receives a value after each reload that
// changed the certificate or the CA bundle (a CA rotation ending drops the
// old CA from the bundle).
func (c *Credentials) Changed() <-chan struct{} { return c.changes.channel() }

// LoadCredentials reads the files once; it fails on a missing or invalid file.
func LoadCredentials(files TLSFiles, log logr.Logger) (*Credentials, error) {
	c := &Credentials{files: files, log: log}
	if _, err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Credentials) reload() (bool, error) {
	var raw [3][]byte
	for i, path := range []string{c.files.CertFile, c.files.KeyFile, c.files.CAFile} {
		b, err := os.ReadFile(path)
		if err != nil {
			return false, err
		}
		raw[i] = b
	}
	c.mu.RLock()
	same := c.cert != nil && bytes.Equal(raw[0], c.raw[0]) && bytes.Equal(raw[1], c.raw[1]) && bytes.Equal(raw[2], c.raw[2])
	c.mu.RUnlock()
	if same {
		return false, nil
	}
	cert, err := tls.X509KeyPair(raw[0], raw[1])
	if err != nil {
		return false, fmt.Errorf("federation certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw[2]) {
		return false, fmt.Errorf("federation CA bundle %s holds no certificate", c.files.CAFile)
	}
	c.mu.Lock()
	c.cert, c.pool, c.raw = &cert, pool, raw
	c.mu.Unlock()
	c.changes.notify()
	return true, nil
}

// Run re-reads the files every interval until ctx ends. A half-written
// rotation (certificate and key not matching yet) keeps the previous pair.
func (c *Credentials) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if changed, err := c.reload(); err != nil {
				c.log.Error(err, "Federation certificates not reloaded; keeping the previous ones")
			} else if changed {
				c.log.Info("Federation certificates reloaded")
			}
		}
	}
}

func (c *Credentials) current() (*tls.Certificate, *x509.CertPool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cert, c.pool
}

// Certificate returns the current certificate and its private key, which
// also sign this picker's Parent-mode marks (package epp/marks).
func (c *Credentials) Certificate() *tls.Certificate {
	cert, _ := c.current()
	return cert
}

// Roots returns the current CA bundle; a new pool after each reload.
func (c *Credentials) Roots() *x509.CertPool {
	_, pool := c.current()
	return pool
}

// ServerOptions are the federation gRPC server's options: mTLS with c,
// keepalive enforced both ways, and bounds on what one client may open and
// send (a subscriber opens one stream and sends one small request).
func ServerOptions(c *Credentials) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(c.ServerConfig())),
		// Subscribers ping every 10 s to notice dead connections: allowed,
		// more often is not.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// The server pings too, so a subscriber that vanished is gone within
		// 15 s, and a connection without a stream within a minute.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, MaxConnectionIdle: time.Minute}),
		grpc.MaxConcurrentStreams(4),
		grpc.MaxRecvMsgSize(16 << 10),
		grpc.ConnectionTimeout(10 * time.Second),
	}
}

// ServerConfig is the federation server's TLS configuration: a client must
// present a certificate signed by the CA; which identities may subscribe is
// decided per stream against the peer directory.
func (c *Credentials) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := c.current()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{*cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    pool,
				NextProtos:   []string{"h2"},
			}, nil
		},
	}
}

// ClientConfig is the TLS configuration for dialing a peer whose certificate
// must carry identity. Peer identities are URIs (SPIFFE IDs) as often as DNS
// names, which Go's host name check does not cover, so the chain and the
// identity are verified in VerifyConnection instead.
func (c *Credentials) ClientConfig(identity string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _ := c.current()
			return cert, nil
		},
		// Verification is not skipped: VerifyConnection below verifies the
		// chain against the current CA pool and then the identity.
		InsecureSkipVerify: true, //nolint:gosec
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, pool := c.current()
			leaf, err := verifyChain(cs.PeerCertificates, pool, x509.ExtKeyUsageServerAuth)
			if err != nil {
				return err
			}
			if !HasIdentity(leaf, identity) {
				return fmt.Errorf("peer certificate is not for %q (it names %v)", identity, Identities(leaf))
			}
			return nil
		},
	}
}

func verifyChain(certs []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage) (*x509.Certificate, error) {
	if len(certs) == 0 {
		return nil, errors.New("peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return nil, err
	}
	return certs[0], nil
}

// Identities lists the URI and DNS names of a certificate.
func Identities(cert *x509.Certificate) []string {
	ids := slices.Clone(cert.DNSNames)
	for _, u := range cert.URIs {
		ids = append(ids, u.String())
	}
	return ids
}

// HasIdentity reports whether cert carries identity as a URI or DNS SAN.
func HasIdentity(cert *x509.Certificate, identity string) bool {
	return identity != "" && slices.Contains(Identities(cert), identity)
}
