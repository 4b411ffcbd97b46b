package marks

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
)

const (
	eastID    = "spiffe://fleetinfer.test/cluster/east/ns/llm/llminferenceservice/llama"
	centralID = "spiffe://fleetinfer.test/cluster/central/ns/llm/llminferenceservice/llama"
)

var pool = types.NamespacedName{Namespace: "llm", Name: "llama"}

func keyPair(t *testing.T, ca *federationtest.CA, id string) *tls.Certificate {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(id)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

func roots(t *testing.T, ca *federationtest.CA) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(ca.PEM) {
		t.Fatal("CA PEM")
	}
	return p
}

func headers(kv [][2]string) map[string]string {
	m := map[string]string{}
	for _, h := range kv {
		m[h[0]] = h[1]
	}
	return m
}

func TestVerify(t *testing.T) {
	ca, err := federationtest.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	other, err := federationtest.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(time.Now().Unix(), 0)
	east := keyPair(t, ca, eastID)
	valid := Mark{Origin: "east", Pool: pool, Pods: "127.13.0.1:8000", Hops: 1, Expires: now.Add(Lifetime).Unix()}
	sign := func(m Mark, c *tls.Certificate) map[string]string {
		t.Helper()
		h, err := Sign(m, c)
		if err != nil {
			t.Fatal(err)
		}
		return headers(h)
	}
	with := func(h map[string]string, k, v string) map[string]string {
		out := map[string]string{}
		for kk, vv := range h {
			out[kk] = vv
		}
		if v == "" {
			delete(out, k)
		} else {
			out[k] = v
		}
		return out
	}
	good := sign(valid, east)
	tests := []struct {
		name    string
		h       map[string]string
		want    string // error substring; "" accepted
		absent  bool
		wantPod []string
	}{
		{name: "valid", h: good, wantPod: []string{"127.13.0.1:8000"}},
		{name: "valid without a pod", h: sign(Mark{Origin: "east", Pool: pool, Hops: 1, Expires: valid.Expires}, east)},
		{name: "absent", h: map[string]string{"content-type": "application/json"}, absent: true},
		{name: "forged signature", h: with(good, Signature, base64.StdEncoding.EncodeToString([]byte("bogus"))), want: "signature"},
		{name: "pod altered", h: with(good, Pod, "127.13.0.2:8000"), want: "signature"},
		{name: "expiry altered", h: with(good, Expires, strconv.FormatInt(valid.Expires+1, 10)), want: "signature"},
		{name: "signature missing", h: with(good, Signature, ""), want: "incomplete"},
		{name: "only client headers", h: map[string]string{Origin: "east", Pod: "127.13.0.1:8000"}, want: "incomplete"},
		{name: "expired", h: sign(Mark{Origin: "east", Pool: pool, Hops: 1, Expires: now.Add(-time.Second).Unix()}, east), want: "expired"},
		{name: "too far ahead", h: sign(Mark{Origin: "east", Pool: pool, Hops: 1, Expires: now.Add(time.Hour).Unix()}, east), want: "ahead"},
		{name: "second hop", h: sign(Mark{Origin: "east", Pool: pool, Hops: 2, Expires: valid.Expires}, east), want: "hop"},
		{name: "unknown cluster", h: sign(Mark{Origin: "north", Pool: pool, Hops: 1, Expires: valid.Expires}, east), want: "not a peer"},
		{name: "another pool", h: sign(Mark{Origin: "east", Pool: types.NamespacedName{Namespace: "llm", Name: "other"}, Hops: 1, Expires: valid.Expires}, east), want: "signature"},
		{name: "another cluster's certificate", h: sign(valid, keyPair(t, ca, centralID)), want: "not for"},
		{name: "certificate from another CA", h: sign(valid, keyPair(t, other, eastID)), want: "CA bundle"},
		{name: "certificate not base64", h: with(good, Cert, "%%%"), want: "base64"},
		{name: "certificate garbage", h: with(good, Cert, base64.StdEncoding.EncodeToString([]byte("garbage"))), want: "parse"},
	}
	bundle := roots(t, ca)
	v := &Verifier{Pool: pool, Roots: func() *x509.CertPool { return bundle }, Now: func() time.Time { return now },
		Identity: func(c string) (string, bool) {
			id, ok := map[string]string{"east": eastID, "central": centralID}[c]
			return id, ok
		}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := v.Verify(func(k string) (string, bool) { s, ok := tc.h[k]; return s, ok })
			switch {
			case tc.absent:
				if !errors.Is(err, ErrAbsent) {
					t.Fatalf("err %v, want ErrAbsent", err)
				}
			case tc.want == "":
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				if m.Origin != "east" || m.Hops != 1 || strings.Join(m.PodList(), ",") != strings.Join(tc.wantPod, ",") {
					t.Fatalf("mark %+v", m)
				}
			case err == nil || errors.Is(err, ErrAbsent) || !strings.Contains(err.Error(), tc.want):
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestChainCachedPerBundle(t *testing.T) {
	ca, err := federationtest.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	h, err := Sign(Mark{Origin: "east", Pool: pool, Hops: 1, Expires: now.Add(Lifetime).Unix()}, keyPair(t, ca, eastID))
	if err != nil {
		t.Fatal(err)
	}
	hm := headers(h)
	get := func(k string) (string, bool) { s, ok := hm[k]; return s, ok }
	bundle := roots(t, ca)
	v := &Verifier{Pool: pool, Roots: func() *x509.CertPool { return bundle },
		Identity: func(string) (string, bool) { return eastID, true }}
	for range 3 {
		if _, err := v.Verify(get); err != nil {
			t.Fatal(err)
		}
	}
	if len(v.cache) != 1 {
		t.Fatalf("%d cached chains, want 1", len(v.cache))
	}
	// A new bundle without the CA: the cached chain no longer counts.
	bundle = x509.NewCertPool()
	if _, err := v.Verify(get); err == nil || !strings.Contains(err.Error(), "CA bundle") {
		t.Fatalf("err %v after the CA left the bundle", err)
	}
}

func TestSignRefusesOtherKeys(t *testing.T) {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*tls.Certificate{nil, {}, {Certificate: [][]byte{{1}}, PrivateKey: rk}, {Certificate: [][]byte{{1}}, PrivateKey: p384}} {
		if _, err := Sign(Mark{Origin: "east", Hops: 1}, c); err == nil {
			t.Errorf("Sign with %T succeeded", c)
		}
	}
}
