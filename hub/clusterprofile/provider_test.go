package clusterprofile_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientauthv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"k8s.io/utils/ptr"
	clusterinventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/cluster-inventory-api/pkg/access"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	"github.com/fleetinfer/fleetinfer/deploy/crds"
	"github.com/fleetinfer/fleetinfer/hub"
	"github.com/fleetinfer/fleetinfer/hub/clusterprofile"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/internal/testutil/testenv"
	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/engaged"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

// The suite runs the provider against a real hub API server with the
// ClusterProfile CRD and two real member API servers, "a" and "b"; each
// member holds a namespace naming it, so a test can tell which member an
// engaged cluster's client reaches.
var (
	env     *testenv.Env
	members = map[string]*controlplane.ControlPlane{}
)

const consumer = "fleetinfer-hub"

// waitTimeout bounds each wait for the provider.
const waitTimeout = 30 * time.Second

// execCredentialEnv turns the test binary into a client-go exec credential
// plugin that prints the ExecCredential in the named file, standing in for
// a KEP-5339 access provider such as OCM's cp-creds.
const execCredentialEnv = "CLUSTERPROFILE_TEST_EXEC_CREDENTIAL"

func TestMain(m *testing.M) {
	if path := os.Getenv(execCredentialEnv); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		_, _ = os.Stdout.Write(b)
		os.Exit(0)
	}
	ctrl.SetLogger(logr.Discard())
	os.Exit(run(m))
}

func run(m *testing.M) int {
	profileCRDs, err := crds.ThirdParty(crds.GroupClusterInv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	reg := &process.Registry{}
	dir, err := os.MkdirTemp("", "fleetinfer-clusterprofile-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	// The members start while testenv starts the hub.
	var membersUp sync.WaitGroup
	var membersErr error
	membersUp.Add(1)
	go func() {
		defer membersUp.Done()
		membersErr = startMembers(dir, reg, "a", "b")
	}()
	code := testenv.Run(m, testenv.Options{CRDs: profileCRDs, Scheme: hub.Scheme}, &env, func(context.Context, *testenv.Env) error {
		membersUp.Wait()
		return membersErr
	})
	membersUp.Wait()
	for _, c := range members {
		c.Stop()
	}
	reg.StopAll(controlplane.StopGrace)
	if alive := reg.Alive(); len(alive) > 0 {
		fmt.Fprintf(os.Stderr, "member processes left running: %v\n", alive)
		return 1
	}
	return code
}

func startMembers(dir string, reg *process.Registry, names ...string) error {
	bins, err := binaries.Locate()
	if err != nil {
		return err
	}
	errs := make(chan error, len(names))
	for _, name := range names {
		c, err := controlplane.New(controlplane.Options{Name: "member-" + name, Dir: filepath.Join(dir, name), Registry: reg,
			Binaries: controlplane.Binaries{Etcd: bins.Etcd, KubeAPIServer: bins.KubeAPIServer}})
		if err != nil {
			return err
		}
		members[name] = c
		go func() {
			ctx := context.Background()
			err := c.Start(ctx)
			if err == nil {
				var cs client.Client
				if cs, err = client.New(c.Admin(), client.Options{}); err == nil {
					err = cs.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: marker(name)}})
				}
			}
			errs <- err
		}()
	}
	var all error
	for range names {
		all = errors.Join(all, <-errs)
	}
	return all
}

func marker(member string) string { return "this-is-member-" + member }

// --- harness ---

type harness struct {
	ns       string
	provider *clusterprofile.Provider
	rec      *engaged.Recorder
}

// startProvider runs the provider on its own ClusterSet namespace under a
// multicluster manager of the hub, with the hub's cluster options, until
// the test ends.
func startProvider(t *testing.T, accessCfg *access.Config) *harness {
	t.Helper()
	h := &harness{ns: testutil.NewNamespace(t, env.Client), rec: engaged.New()}
	h.provider = clusterprofile.New(clusterprofile.Options{Namespace: h.ns, Consumer: consumer, Access: accessCfg,
		ClusterOptions: hub.ClusterOptions()})
	mgr, err := mcmanager.New(env.Config, h.provider, mcmanager.Options{
		Scheme:  hub.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Every test runs the provider's controller in a manager of its own.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Add(h.rec); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := h.provider.SetupWithManager(ctx, mgr); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return h
}

func (h *harness) profile(t *testing.T, name string, status *clusterinventoryv1alpha1.ClusterProfileStatus) *clusterinventoryv1alpha1.ClusterProfile {
	t.Helper()
	ctx := context.Background()
	cp := &clusterinventoryv1alpha1.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name},
		Spec:       clusterinventoryv1alpha1.ClusterProfileSpec{DisplayName: name, ClusterManager: clusterinventoryv1alpha1.ClusterManager{Name: "test"}},
	}
	if err := env.Client.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if status != nil {
		cp.Status = *status
		if err := env.Client.Status().Update(ctx, cp); err != nil {
			t.Fatal(err)
		}
	}
	return cp
}

// secret writes the Secret-strategy Secret of profile with the admin
// kubeconfig of member, or with data as the kubeconfig when member is "".
func (h *harness) secret(t *testing.T, profile, member string, data []byte) *corev1.Secret {
	t.Helper()
	if member != "" {
		data = kubeconfig(t, member)
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: profile + "-" + consumer,
			Labels: map[string]string{clusterprofile.ConsumerLabel: consumer, clusterprofile.ProfileLabel: profile}},
		Data: map[string][]byte{clusterprofile.SecretKey: data},
	}
	if err := env.Client.Create(context.Background(), sec); err != nil {
		t.Fatal(err)
	}
	return sec
}

func kubeconfig(t *testing.T, member string) []byte {
	t.Helper()
	kc, err := controlplane.Kubeconfig("member-"+member, members[member].Admin())
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// engagedWith waits until the cluster is engaged and its client reaches
// member.
func (h *harness) engagedWith(t *testing.T, name, member string) cluster.Cluster {
	t.Helper()
	var cl cluster.Cluster
	testutil.Eventually(t, waitTimeout, name+" engaged with member "+member, func(ctx context.Context) error {
		if cl = h.rec.Cluster(name); cl == nil {
			return fmt.Errorf("not engaged; engagements: %q", h.rec.History())
		}
		got, err := h.provider.Get(ctx, multicluster.ClusterName(name))
		if err != nil || got != cl {
			return fmt.Errorf("provider.Get = %v, %v; want the engaged cluster", got, err)
		}
		return reaches(ctx, cl, member)
	})
	return cl
}

func reaches(ctx context.Context, cl cluster.Cluster, member string) error {
	return cl.GetAPIReader().Get(ctx, client.ObjectKey{Name: marker(member)}, &corev1.Namespace{})
}

// refused waits for a Warning Event with reason on the profile and checks
// that the cluster is not engaged.
func (h *harness) refused(t *testing.T, name, reason string) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, name+" refused with "+reason, func(ctx context.Context) error {
		var events corev1.EventList
		if err := env.Client.List(ctx, &events, client.InNamespace(h.ns)); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Kind == "ClusterProfile" && e.InvolvedObject.Name == name && e.Type == corev1.EventTypeWarning && e.Reason == reason {
				if e.Message == "" {
					return errors.New("the event says nothing")
				}
				return nil
			}
		}
		return fmt.Errorf("no Warning %s among %d events", reason, len(events.Items))
	})
	if cl := h.rec.Cluster(name); cl != nil {
		t.Errorf("%s is engaged; engagements: %q", name, h.rec.History())
	}
	if _, err := h.provider.Get(context.Background(), multicluster.ClusterName(name)); !errors.Is(err, multicluster.ErrClusterNotFound) {
		t.Errorf("provider.Get(%s) = %v, want ErrClusterNotFound", name, err)
	}
}

func (h *harness) disengaged(t *testing.T, name string) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, name+" disengaged", func(ctx context.Context) error {
		if h.rec.Cluster(name) != nil {
			return fmt.Errorf("still engaged; engagements: %q", h.rec.History())
		}
		if _, err := h.provider.Get(ctx, multicluster.ClusterName(name)); !errors.Is(err, multicluster.ErrClusterNotFound) {
			return fmt.Errorf("provider.Get = %v", err)
		}
		return nil
	})
}

// gauge reads fleetinfer_hub_clusterprofile_engaged for a cluster; ok is
// false when the series does not exist.
func gauge(t *testing.T, name string) (value float64, ok bool) {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "fleetinfer_hub_clusterprofile_engaged" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "cluster" && l.GetValue() == name {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// --- tests ---

// A profile with a Secret is engaged under its own name, with a client that
// reaches the member the kubeconfig names, whatever its health: the
// inventory, not the provider, acts on ControlPlaneHealthy.
func TestProfileWithSecretEngagesAndReachesTheMember(t *testing.T) {
	h := startProvider(t, nil)
	h.profile(t, "sp-alpha", &clusterinventoryv1alpha1.ClusterProfileStatus{Conditions: []metav1.Condition{{
		Type: clusterinventoryv1alpha1.ClusterConditionControlPlaneHealthy, Status: metav1.ConditionFalse,
		Reason: "Probing", Message: "not yet known", LastTransitionTime: metav1.Now()}}})
	h.secret(t, "sp-alpha", "a", nil)
	h.engagedWith(t, "sp-alpha", "a")
	if v, ok := gauge(t, "sp-alpha"); !ok || v != 1 {
		t.Errorf("engaged gauge = %v (present %v), want 1", v, ok)
	}
	if got := h.rec.History(); got != "+sp-alpha" {
		t.Errorf("engagements %q, want one", got)
	}
}

// A new kubeconfig in the Secret re-engages the cluster with it; a change
// that leaves the kubeconfig alone does not.
func TestChangedKubeconfigReEngages(t *testing.T) {
	h := startProvider(t, nil)
	h.profile(t, "sp-beta", nil)
	sec := h.secret(t, "sp-beta", "a", nil)
	first := h.engagedWith(t, "sp-beta", "a")
	ctx := context.Background()

	sec.Annotations = map[string]string{"touched": "true"}
	if err := env.Client.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	sec.Data[clusterprofile.SecretKey] = kubeconfig(t, "b")
	if err := env.Client.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	second := h.engagedWith(t, "sp-beta", "b")
	if second == first {
		t.Fatal("the same cluster is still engaged")
	}
	// The old engagement ends; the new one stays (stopping the old
	// cluster must not take its successor with it).
	testutil.Eventually(t, waitTimeout, "old engagement ended", func(context.Context) error {
		got := h.rec.History()
		if strings.Count(got, "+sp-beta") != 2 || strings.Count(got, "-sp-beta") != 1 {
			return fmt.Errorf("engagements %q, want two and one end", got)
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond)
	if h.rec.Cluster("sp-beta") != second {
		t.Fatalf("re-engaged cluster went away; engagements %q", h.rec.History())
	}
}

// Deleting the profile disengages the cluster and drops its gauge.
func TestDeletingTheProfileDisengages(t *testing.T) {
	h := startProvider(t, nil)
	cp := h.profile(t, "sp-gamma", nil)
	h.secret(t, "sp-gamma", "a", nil)
	h.engagedWith(t, "sp-gamma", "a")
	if err := env.Client.Delete(context.Background(), cp); err != nil {
		t.Fatal(err)
	}
	h.disengaged(t, "sp-gamma")
	testutil.Eventually(t, waitTimeout, "gauge dropped", func(context.Context) error {
		if _, ok := gauge(t, "sp-gamma"); ok {
			return errors.New("the gauge still has the cluster")
		}
		return nil
	})
}

// A profile without credentials is refused with a Warning Event until its
// Secret appears (the Secret's own event engages it), and disengaged
// again when the Secret goes.
func TestProfileWithoutCredentialsWaitsForItsSecret(t *testing.T) {
	h := startProvider(t, nil)
	h.profile(t, "sp-delta", nil)
	h.refused(t, "sp-delta", clusterprofile.ReasonNoCredentials)
	if v, ok := gauge(t, "sp-delta"); !ok || v != 0 {
		t.Errorf("engaged gauge = %v (present %v), want 0", v, ok)
	}
	sec := h.secret(t, "sp-delta", "b", nil)
	h.engagedWith(t, "sp-delta", "b")
	if err := env.Client.Delete(context.Background(), sec); err != nil {
		t.Fatal(err)
	}
	h.disengaged(t, "sp-delta")
}

// A profile whose name is no DNS label never becomes a cluster, however
// good its credentials.
func TestInvalidClusterNameIsRefused(t *testing.T) {
	h := startProvider(t, nil)
	h.profile(t, "sp.epsilon", nil)
	h.secret(t, "sp.epsilon", "a", nil)
	h.refused(t, "sp.epsilon", clusterprofile.ReasonInvalidName)
}

// A Secret whose kubeconfig does not parse is refused with the reason.
func TestBadKubeconfigIsRefused(t *testing.T) {
	h := startProvider(t, nil)
	h.profile(t, "sp-zeta", nil)
	h.secret(t, "sp-zeta", "", []byte("this is: [not a kubeconfig"))
	h.refused(t, "sp-zeta", clusterprofile.ReasonInvalidCredentials)
}

// With an access provider file, a profile listing a provider the hub has an
// exec plugin for is reached through that plugin (KEP-5339), even when a
// Secret for it exists too; the server and CA come from the profile.
func TestAccessProviderComesBeforeTheSecret(t *testing.T) {
	cfg, err := members["a"].UserConfig("plugin-user", controlplane.AdminGroup)
	if err != nil {
		t.Fatal(err)
	}
	cred, err := json.Marshal(clientauthv1.ExecCredential{
		TypeMeta: metav1.TypeMeta{APIVersion: clientauthv1.SchemeGroupVersion.String(), Kind: "ExecCredential"},
		Status:   &clientauthv1.ExecCredentialStatus{ClientCertificateData: string(cfg.CertData), ClientKeyData: string(cfg.KeyData)},
	})
	if err != nil {
		t.Fatal(err)
	}
	credFile := filepath.Join(t.TempDir(), "credential.json")
	if err := os.WriteFile(credFile, cred, 0o600); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := startProvider(t, access.New([]access.Provider{{Name: "test-plugin", ExecConfig: &clientcmdapi.ExecConfig{
		APIVersion: clientauthv1.SchemeGroupVersion.String(), Command: self,
		Env: []clientcmdapi.ExecEnvVar{{Name: execCredentialEnv, Value: credFile}},
	}}}))
	h.profile(t, "sp-eta", &clusterinventoryv1alpha1.ClusterProfileStatus{AccessProviders: []clusterinventoryv1alpha1.AccessProvider{{
		Name: "test-plugin", Cluster: clientcmdv1.Cluster{Server: members["a"].URL(), CertificateAuthorityData: members["a"].CACert()}}}})
	h.secret(t, "sp-eta", "b", nil)
	h.engagedWith(t, "sp-eta", "a")
}
