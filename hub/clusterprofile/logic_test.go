package clusterprofile

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	clusterinventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/cluster-inventory-api/pkg/access"
)

func TestNameProblem(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"east", true},
		{"us-east-1", true},
		{"0gpu", true},
		{"east.example.com", false}, // a valid object name, but not a label
		{"East", false},
		{"-east", false},
		{"a23456789012345678901234567890123456789012345678901234567890123", true},
		{"a234567890123456789012345678901234567890123456789012345678901234", false},
	} {
		if got := nameProblem(c.name); (got == "") != c.ok {
			t.Errorf("nameProblem(%q) = %q, want ok=%v", c.name, got, c.ok)
		}
	}
}

func TestAccessProviderFor(t *testing.T) {
	ap := func(name, server string) clusterinventoryv1alpha1.AccessProvider {
		return clusterinventoryv1alpha1.AccessProvider{Name: name, Cluster: clientcmdv1.Cluster{Server: server}}
	}
	cfg := access.New([]access.Provider{{Name: "ocm"}, {Name: "token"}})
	for _, c := range []struct {
		what       string
		cfg        *access.Config
		access     []clusterinventoryv1alpha1.AccessProvider
		credential []clusterinventoryv1alpha1.AccessProvider
		want       string // server of the chosen provider, "" for none
	}{
		{"no config: the Secret strategy", nil, []clusterinventoryv1alpha1.AccessProvider{ap("ocm", "https://a")}, nil, ""},
		{"no provider the hub knows", cfg, []clusterinventoryv1alpha1.AccessProvider{ap("other", "https://a")}, nil, ""},
		{"the config's order decides", cfg, []clusterinventoryv1alpha1.AccessProvider{ap("token", "https://t"), ap("ocm", "https://o")}, nil, "https://o"},
		{"deprecated credentialProviders still count", cfg, nil, []clusterinventoryv1alpha1.AccessProvider{ap("token", "https://t")}, "https://t"},
		{"accessProviders win over credentialProviders", cfg,
			[]clusterinventoryv1alpha1.AccessProvider{ap("ocm", "https://new")}, []clusterinventoryv1alpha1.AccessProvider{ap("ocm", "https://old")}, "https://new"},
	} {
		cp := &clusterinventoryv1alpha1.ClusterProfile{Status: clusterinventoryv1alpha1.ClusterProfileStatus{
			AccessProviders: c.access, CredentialProviders: c.credential}}
		got := ""
		if p := accessProviderFor(c.cfg, cp); p != nil {
			got = p.Cluster.Server
		}
		if got != c.want {
			t.Errorf("%s: chose %q, want %q", c.what, got, c.want)
		}
	}
}

func TestProfileOfSecret(t *testing.T) {
	p := New(Options{Namespace: "set", Consumer: "fleetinfer-hub"})
	for _, c := range []struct {
		labels map[string]string
		want   string
	}{
		{map[string]string{ConsumerLabel: "fleetinfer-hub", ProfileLabel: "east"}, "east"},
		{map[string]string{ConsumerLabel: "kueue", ProfileLabel: "east"}, ""},
		{map[string]string{ConsumerLabel: "fleetinfer-hub"}, ""},
		{nil, ""},
	} {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "set", Name: "any", Labels: c.labels}}
		reqs := p.profileOfSecret(t.Context(), sec)
		got := ""
		if len(reqs) == 1 && reqs[0].Namespace == "set" {
			got = reqs[0].Name
		}
		if got != c.want || len(reqs) > 1 {
			t.Errorf("labels %v: requests %v, want profile %q", c.labels, reqs, c.want)
		}
	}
}

// The hash tells credentials apart by where they came from as well as by
// their bytes.
func TestHashOf(t *testing.T) {
	a, b := []byte("kubeconfig A"), []byte("kubeconfig B")
	if hashOf("secret", a) != hashOf("secret", a) {
		t.Error("the same credentials hash differently")
	}
	if hashOf("secret", a) == hashOf("secret", b) {
		t.Error("changed credentials hash the same")
	}
	if hashOf("secret", a) == hashOf("access-provider", a) {
		t.Error("a switch of strategy with the same bytes hashes the same")
	}
}
