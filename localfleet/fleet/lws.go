package fleet

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"
	"sigs.k8s.io/yaml"

	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/ports"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

// LWSUser is the identity of the LeaderWorkerSet controller in each spoke.
const LWSUser = "lws-controller-manager"

// lwsNamePrefix is what LWS's own install (config/default) puts before the
// names of its cluster objects.
const lwsNamePrefix = "lws-"

// startLWS runs the LeaderWorkerSet controller (sigs.k8s.io/lws cmd) against
// the spoke as a process, as it runs in a real cluster, with only the
// ClusterRole its module ships. The API server must call its pod and
// LeaderWorkerSet webhooks, so they listen on a loopback port with a
// certificate of their own, and the webhook configurations of the same
// module point there by URL. LWS's internal certificate management is off:
// it issues certificates for <service>.<namespace>.svc, a name nothing
// resolves to here.
func (f *Fleet) startLWS(ctx context.Context, c *Cluster) error {
	began := time.Now()
	bin := f.opts.Binaries.LWS
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%s is missing: run `make tools` first", bin)
	}
	manifests := filepath.Dir(bin)
	if err := grantLWS(ctx, c, filepath.Join(manifests, "role.yaml")); err != nil {
		return err
	}
	cfg, err := c.UserConfig(LWSUser)
	if err != nil {
		return err
	}
	dir := filepath.Join(c.Dir(), "lws")
	certDir := filepath.Join(dir, "certs")
	if err := os.MkdirAll(certDir, 0o755); err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(kubeconfig, c.Name(), cfg); err != nil {
		return err
	}
	ca, cert, key, err := controlplane.ServingCert("lws-webhook", net.IPv4(127, 0, 0, 1))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(certDir, "tls.crt"), cert, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(certDir, "tls.key"), key, 0o600); err != nil {
		return err
	}
	free, err := ports.Free(2)
	if err != nil {
		return err
	}
	webhookPort, probe := free[0], net.JoinHostPort("127.0.0.1", strconv.Itoa(free[1]))
	// LWS's component configuration (config.lws.x-k8s.io); JSON is YAML.
	config, err := json.Marshal(map[string]any{
		"apiVersion":             "config.lws.x-k8s.io/v1alpha1",
		"kind":                   "Configuration",
		"leaderElection":         map[string]any{"leaderElect": false},
		"internalCertManagement": map[string]any{"enable": false},
		"webhook":                map[string]any{"host": "127.0.0.1", "port": webhookPort, "certDir": certDir},
		"health":                 map[string]any{"healthProbeBindAddress": probe},
		// Its metrics are served over HTTPS with delegated authorization;
		// nothing here scrapes them.
		"metrics": map[string]any{"bindAddress": "0"},
	})
	if err != nil {
		return err
	}
	configPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configPath, config, 0o600); err != nil {
		return err
	}
	p, err := process.Start(process.Spec{
		Name:    c.Name() + "/lws-controller",
		Path:    bin,
		Args:    []string{"--config=" + configPath, "--kubeconfig=" + kubeconfig, "--zap-devel=false"},
		LogPath: filepath.Join(c.Dir(), "logs", "lws-controller.log"),
	}, f.Registry)
	if err != nil {
		return err
	}
	if err := controlplane.WaitHTTP(ctx, p, http.DefaultClient, "http://"+probe+"/readyz", time.Minute); err != nil {
		return err
	}
	url := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(webhookPort))
	if err := installLWSWebhooks(ctx, c, filepath.Join(manifests, "webhook.yaml"), url, ca); err != nil {
		return err
	}
	if err := waitLWSWebhooks(ctx, c, p); err != nil {
		return err
	}
	f.opts.Log.Info("LeaderWorkerSet controller up", "cluster", c.Name(), "took", time.Since(began).Round(time.Millisecond).String())
	return nil
}

// grantLWS binds LWS's own ClusterRole (config/rbac/role.yaml of the module)
// to LWSUser.
func grantLWS(ctx context.Context, c *Cluster, rolePath string) error {
	b, err := os.ReadFile(rolePath)
	if err != nil {
		return err
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(b, role); err != nil {
		return fmt.Errorf("%s: %w", rolePath, err)
	}
	role.Name = lwsNamePrefix + role.Name
	if err := upsert(ctx, c.Client, role); err != nil {
		return err
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name + "binding"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: LWSUser}},
	}
	return client.IgnoreAlreadyExists(c.Client.Create(ctx, crb))
}

// installLWSWebhooks creates (or, in a cluster started again from its data,
// updates) LWS's webhook configurations as its install names them, each
// webhook calling url plus its path instead of the in-cluster Service.
func installLWSWebhooks(ctx context.Context, c *Cluster, path, url string, ca []byte) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	found := 0
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if k := u.GetKind(); k != "MutatingWebhookConfiguration" && k != "ValidatingWebhookConfiguration" {
			continue // the webhook Service: there is no in-cluster endpoint
		}
		hooks, _, err := unstructured.NestedSlice(u.Object, "webhooks")
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for _, h := range hooks {
			hook, _ := h.(map[string]any)
			p, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			if p == "" {
				return fmt.Errorf("%s: webhook %v has no service path", path, hook["name"])
			}
			hook["clientConfig"] = map[string]any{"url": url + p, "caBundle": base64.StdEncoding.EncodeToString(ca)}
		}
		if err := unstructured.SetNestedSlice(u.Object, hooks, "webhooks"); err != nil {
			return err
		}
		found++
		u.SetName(lwsNamePrefix + u.GetName())
		if err := upsert(ctx, c.Client, u); err != nil {
			return err
		}
	}
	if found != 2 {
		return fmt.Errorf("%s: want a mutating and a validating webhook configuration, found %d", path, found)
	}
	return nil
}

// upsert creates obj or replaces an existing object's content with it.
func upsert(ctx context.Context, cl client.Client, obj client.Object) error {
	err := cl.Create(ctx, obj)
	if err == nil || !apierrors.IsAlreadyExists(err) {
		return err
	}
	cur := obj.DeepCopyObject().(client.Object)
	if err := cl.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
		return err
	}
	obj.SetResourceVersion(cur.GetResourceVersion())
	return cl.Update(ctx, obj)
}

// waitLWSWebhooks waits until the API server gets answers from both kinds of
// webhook: the controller registers them only once it has started, and a
// LeaderWorkerSet or one of its pods created before then would be refused
// (failurePolicy Fail). Server-side dry runs go through admission without
// storing anything.
func waitLWSWebhooks(ctx context.Context, c *Cluster, p *process.Process) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	const name = "lws-webhook-probe"
	container := corev1.Container{Name: "probe", Image: "probe"}
	lws := &lwsv1.LeaderWorkerSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: lwsv1.LeaderWorkerSetSpec{
			StartupPolicy:   lwsv1.LeaderCreatedStartupPolicy,
			RolloutStrategy: lwsv1.RolloutStrategy{Type: lwsv1.RollingUpdateStrategyType},
			LeaderWorkerTemplate: lwsv1.LeaderWorkerTemplate{
				WorkerTemplate: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{container}}},
			},
		},
	}
	// A group leader as LWS's leader StatefulSet stamps it out; the pod
	// webhook gives it the group's environment.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-0", Namespace: metav1.NamespaceDefault,
			Labels:      map[string]string{lwsv1.SetNameLabelKey: name, lwsv1.WorkerIndexLabelKey: "0"},
			Annotations: map[string]string{lwsv1.SizeAnnotationKey: "1"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{container}},
	}
	var last error
	for {
		last = c.Client.Create(ctx, lws.DeepCopy(), client.DryRunAll)
		if last == nil {
			probe := pod.DeepCopy()
			if last = c.Client.Create(ctx, probe, client.DryRunAll); last == nil {
				if hasEnv(probe.Spec.Containers[0], lwsv1.LwsLeaderAddress) {
					return nil
				}
				last = errors.New("the pod webhook did not add the group's environment")
			}
		}
		select {
		case <-p.Done():
			return fmt.Errorf("%s exited before its webhooks answered (%v); see %s", p.Name, p.ExitErr(), p.LogPath)
		case <-ctx.Done():
			return fmt.Errorf("%s: webhooks not answering: %v; see %s", p.Name, last, p.LogPath)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func hasEnv(c corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name {
			return true
		}
	}
	return false
}
