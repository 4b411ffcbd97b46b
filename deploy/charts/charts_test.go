package charts_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/fleetinfer/fleetinfer/apis"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/deploy/charts"
	"github.com/fleetinfer/fleetinfer/spoke/presets"
)

const (
	release   = "fleetinfer-spoke"
	namespace = "fleetinfer-system"
	// certManager is what --api-versions says of a cluster with cert-manager.
	certManager = "cert-manager.io/v1/Certificate"
)

// rendered indexes a rendering by "Kind/name"; the namespace is left out
// because only Certificates (one per service namespace) share a name, and
// they are looked at as a list.
type rendered map[string]*unstructured.Unstructured

func render(t *testing.T, values string, apiVersions ...string) rendered {
	t.Helper()
	objs, err := renderErr(values, apiVersions...)
	if err != nil {
		t.Fatal(err)
	}
	out := rendered{}
	seen := map[string]bool{}
	for _, o := range objs {
		full := o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
		if seen[full] {
			t.Fatalf("%s rendered twice", full)
		}
		seen[full] = true
		key := o.GetKind() + "/" + o.GetName()
		if o.GetKind() == "Certificate" {
			key += "@" + o.GetNamespace()
		}
		out[key] = o
	}
	return out
}

func renderErr(values string, apiVersions ...string) ([]*unstructured.Unstructured, error) {
	c, err := charts.Load(charts.Spoke)
	if err != nil {
		return nil, err
	}
	v := map[string]any{}
	if err := yaml.Unmarshal([]byte(values), &v); err != nil {
		return nil, err
	}
	return charts.Render(c, charts.Options{ReleaseName: release, Namespace: namespace, Values: v, APIVersions: apiVersions})
}

func (r rendered) kinds(kind string) []string {
	var names []string
	for _, o := range r {
		if o.GetKind() == kind {
			names = append(names, o.GetName())
		}
	}
	slices.Sort(names)
	return names
}

func into[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	if o == nil {
		t.Fatal("object not rendered")
	}
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
		t.Fatalf("%s/%s: %v", o.GetKind(), o.GetName(), err)
	}
	return out
}

func (r rendered) deployment(t *testing.T) *appsv1.Deployment {
	return into[appsv1.Deployment](t, r["Deployment/"+release])
}

func (r rendered) args(t *testing.T) []string {
	return r.deployment(t).Spec.Template.Spec.Containers[0].Args
}

func (r rendered) scheduler(t *testing.T, prefix string) *v1alpha2.LLMInferenceServiceConfig {
	return into[v1alpha2.LLMInferenceServiceConfig](t, r["LLMInferenceServiceConfig/"+prefix+"config-llm-scheduler"])
}

// generatedRules are the rules controller-gen wrote from the markers.
func generatedRules(t *testing.T, kind string) []rbacv1.PolicyRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(charts.Spoke, "generated", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := charts.ParseManifests(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == kind {
			return into[rbacv1.ClusterRole](t, o).Rules
		}
	}
	t.Fatalf("no %s in the generated RBAC", kind)
	return nil
}

var gieCRDs = []string{
	"inferencemodelrewrites.inference.networking.x-k8s.io", "inferenceobjectives.inference.networking.x-k8s.io",
	"inferencepoolimports.inference.networking.x-k8s.io", "inferencepools.inference.networking.k8s.io",
}

// ownCRDsPlus lists fleetinfer's own CRDs (apis/crds), which crds/ always
// holds, and extra ones.
func ownCRDsPlus(t *testing.T, extra ...[]string) []string {
	t.Helper()
	own, err := apis.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range own {
		out = append(out, c.Name)
	}
	for _, e := range extra {
		out = append(out, e...)
	}
	slices.Sort(out)
	return out
}

// With default values the chart installs the controller, its generated RBAC,
// fleetinfer's and GIE's CRDs, and presets identical to the ones the
// controller embeds, which it is told not to install itself.
func TestDefaultValuesInstallControllerRBACCRDsAndTheControllersOwnPresets(t *testing.T) {
	r := render(t, "")

	if got, want := r.kinds("CustomResourceDefinition"), ownCRDsPlus(t, gieCRDs); !slices.Equal(got, want) {
		t.Errorf("CRDs %v, want %v", got, want)
	}
	d := r.deployment(t)
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "ghcr.io/fleetinfer/spoke:v0.1.0" {
		t.Errorf("image %s", c.Image)
	}
	for _, want := range []string{"--system-namespace=" + namespace, "--install-presets=false", "--preset-prefix=kserve-",
		"--default-gateway=" + namespace + "/inference-gateway", "--leader-elect=false", "--metrics-bind-address=:8080",
		"--health-probe-bind-address=:8081", "--federation-address=LoadBalancer"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %v lack %s", c.Args, want)
		}
	}
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("one replica without leader election must be recreated, not rolled: %s", d.Spec.Strategy.Type)
	}
	if c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.Resources.Requests.Cpu().IsZero() {
		t.Errorf("probes or resources missing: %+v", c)
	}
	if sa := d.Spec.Template.Spec.ServiceAccountName; r["ServiceAccount/"+sa] == nil {
		t.Errorf("ServiceAccount %s not rendered", sa)
	}
	if r["Service/"+release+"-metrics"] == nil {
		t.Error("no metrics Service")
	}

	role := into[rbacv1.ClusterRole](t, r["ClusterRole/"+release])
	if !equality.Semantic.DeepEqual(role.Rules, generatedRules(t, "ClusterRole")) {
		t.Errorf("ClusterRole rules are not the generated ones: %v", role.Rules)
	}
	binding := into[rbacv1.ClusterRoleBinding](t, r["ClusterRoleBinding/"+release])
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != d.Spec.Template.Spec.ServiceAccountName ||
		binding.Subjects[0].Namespace != namespace {
		t.Errorf("binding %+v", binding)
	}
	if got := r.kinds("Role"); len(got) != 0 {
		t.Errorf("Roles %v rendered although the controller does not install presets", got)
	}

	want, err := presets.Load(namespace, "kserve-")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.kinds("LLMInferenceServiceConfig"); len(got) != len(want) {
		t.Fatalf("%d presets, the controller embeds %d", len(got), len(want))
	}
	for _, w := range want {
		got := into[v1alpha2.LLMInferenceServiceConfig](t, r["LLMInferenceServiceConfig/"+w.Name])
		if got.Namespace != namespace || !equality.Semantic.DeepEqual(got.Spec, w.Spec) {
			t.Errorf("preset %s differs from the controller's:\n%s", w.Name, diffYAML(got.Spec, w.Spec))
		}
	}
}

func diffYAML(a, b any) string {
	ya, _ := yaml.Marshal(a)
	yb, _ := yaml.Marshal(b)
	la, lb := strings.Split(string(ya), "\n"), strings.Split(string(yb), "\n")
	var out []string
	for i := range max(len(la), len(lb)) {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			out = append(out, fmt.Sprintf("chart: %s\nwant:  %s", x, y))
		}
	}
	return strings.Join(out, "\n")
}

func TestNonDefaultValues(t *testing.T) {
	tests := []struct {
		name        string
		values      string
		apiVersions []string
		check       func(t *testing.T, r rendered)
	}{
		{
			name:   "more than one replica elects a leader and rolls pod by pod",
			values: "replicas: 2",
			check: func(t *testing.T, r rendered) {
				d := r.deployment(t)
				if !slices.Contains(r.args(t), "--leader-elect=true") || !slices.Contains(r.args(t), "--leader-election-namespace="+namespace) || d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType ||
					d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
					t.Errorf("args %v strategy %+v", r.args(t), d.Spec.Strategy)
				}
			},
		},
		{
			name:   "leader election can be forced on with one replica",
			values: "leaderElection: {enabled: true}",
			check: func(t *testing.T, r rendered) {
				if !slices.Contains(r.args(t), "--leader-elect=true") {
					t.Errorf("args %v", r.args(t))
				}
			},
		},
		{
			name:   "a cluster whose pod network others reach reports pickers at their pod IPs",
			values: "controller: {federationAddress: PodIP}",
			check: func(t *testing.T, r rendered) {
				if !slices.Contains(r.args(t), "--federation-address=PodIP") {
					t.Errorf("args %v", r.args(t))
				}
			},
		},
		{
			name:   "a digest pins the image",
			values: "image: {repository: registry.example/spoke, digest: sha256:" + strings.Repeat("ab", 32) + "}",
			check: func(t *testing.T, r rendered) {
				if got := r.deployment(t).Spec.Template.Spec.Containers[0].Image; got != "registry.example/spoke@sha256:"+strings.Repeat("ab", 32) {
					t.Errorf("image %s", got)
				}
			},
		},
		{
			name:   "controller-installed presets: no preset objects, the controller installs them with its Role",
			values: "presets: {source: controller}",
			check: func(t *testing.T, r rendered) {
				if got := r.kinds("LLMInferenceServiceConfig"); len(got) != 0 {
					t.Errorf("presets rendered: %v", got)
				}
				if !slices.Contains(r.args(t), "--install-presets=true") {
					t.Errorf("args %v", r.args(t))
				}
				role := into[rbacv1.Role](t, r["Role/"+release+"-presets"])
				if role.Namespace != namespace || !equality.Semantic.DeepEqual(role.Rules, generatedRules(t, "Role")) {
					t.Errorf("presets Role %+v", role)
				}
				if rb := into[rbacv1.RoleBinding](t, r["RoleBinding/"+release+"-presets"]); rb.RoleRef.Name != role.Name {
					t.Errorf("RoleBinding %+v", rb)
				}
			},
		},
		{
			name:   "a preset prefix renames presets and tells the controller",
			values: "presets: {prefix: acme-}",
			check: func(t *testing.T, r rendered) {
				if r.scheduler(t, "acme-") == nil || !slices.Contains(r.args(t), "--preset-prefix=acme-") {
					t.Errorf("args %v presets %v", r.args(t), r.kinds("LLMInferenceServiceConfig"))
				}
			},
		},
		{
			name:   "EPP image, resources and extra flags go into the scheduler preset",
			values: "epp: {image: {repository: registry.example/epp, tag: v9}, resources: {requests: {cpu: '1'}}, extraArgs: [--refresh-metrics-interval=100ms]}",
			check: func(t *testing.T, r rendered) {
				c := r.scheduler(t, "kserve-").Spec.Router.Scheduler.Template.Containers[0]
				if c.Image != "registry.example/epp:v9" || c.Resources.Requests.Cpu().String() != "1" ||
					c.Args[len(c.Args)-1] != "--refresh-metrics-interval=100ms" || !slices.Contains(c.Args, "--pool-namespace") {
					t.Errorf("EPP container %+v", c)
				}
			},
		},
		{
			name:   "federation from an existing Secret: flags, port and volumes, no Certificate",
			values: "federation: {enabled: true, clusterName: east, mode: Parent}",
			check: func(t *testing.T, r rendered) {
				pod := r.scheduler(t, "kserve-").Spec.Router.Scheduler.Template
				c := pod.Containers[0]
				for _, want := range []string{"--federation-cluster=east", "--federation-mode=Parent", "--federation-port=9004",
					"--federation-cert-file=/etc/fleetinfer/federation/tls/tls.crt", "--federation-peers-file=/etc/fleetinfer/federation/peers/peers.yaml"} {
					if !slices.Contains(c.Args, want) {
						t.Errorf("EPP args %v lack %s", c.Args, want)
					}
				}
				if len(pod.Volumes) != 2 || pod.Volumes[0].Secret.SecretName != "fleetinfer-epp-federation" || !*pod.Volumes[1].ConfigMap.Optional ||
					len(c.VolumeMounts) != 2 || c.Ports[len(c.Ports)-1].ContainerPort != 9004 {
					t.Errorf("volumes %+v mounts %+v ports %+v", pod.Volumes, c.VolumeMounts, c.Ports)
				}
				if got := r.kinds("Certificate"); len(got) != 0 {
					t.Errorf("Certificates %v", got)
				}
			},
		},
		{
			name: "federation from cert-manager: one Certificate per service namespace with the cluster's SPIFFE ID",
			values: `federation: {enabled: true, clusterName: east, tls: {source: certManager,
				certManager: {issuerRef: {name: fleet-ca}, trustDomain: example.org, namespaces: [llm, team-b]}}}`,
			apiVersions: []string{certManager},
			check: func(t *testing.T, r rendered) {
				var nss []string
				for _, o := range r {
					if o.GetKind() != "Certificate" {
						continue
					}
					nss = append(nss, o.GetNamespace())
					uris, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "uris")
					usages, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "usages")
					issuer, _, _ := unstructured.NestedString(o.Object, "spec", "issuerRef", "name")
					if !slices.Equal(uris, []string{"spiffe://example.org/east/epp"}) || issuer != "fleet-ca" ||
						!slices.Contains(usages, "server auth") || !slices.Contains(usages, "client auth") {
						t.Errorf("Certificate %v", o.Object["spec"])
					}
				}
				slices.Sort(nss)
				if !slices.Equal(nss, []string{"llm", "team-b"}) {
					t.Errorf("Certificates in %v", nss)
				}
			},
		},
		{
			name: "federation from cert-manager per service: a Certificate per service with the hub's identity, mounted by that service's picker",
			values: `federation: {enabled: true, clusterName: east, tls: {source: certManager,
				certManager: {issuerRef: {name: fleet-ca}, trustDomain: example.org, services: [{namespace: llm, name: llama}, {namespace: team-b, name: qwen}]}}}`,
			apiVersions: []string{certManager},
			check: func(t *testing.T, r rendered) {
				var got []string
				for _, o := range r {
					if o.GetKind() != "Certificate" {
						continue
					}
					secret, _, _ := unstructured.NestedString(o.Object, "spec", "secretName")
					uris, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "uris")
					got = append(got, o.GetNamespace()+"/"+o.GetName()+" "+secret+" "+strings.Join(uris, ","))
				}
				slices.Sort(got)
				want := []string{
					"llm/llama-epp-federation llama-epp-federation spiffe://example.org/cluster/east/ns/llm/llminferenceservice/llama",
					"team-b/qwen-epp-federation qwen-epp-federation spiffe://example.org/cluster/east/ns/team-b/llminferenceservice/qwen",
				}
				if !slices.Equal(got, want) {
					t.Errorf("Certificates %q, want %q", got, want)
				}
				pod := r.scheduler(t, "kserve-").Spec.Router.Scheduler.Template
				if len(pod.Volumes) != 2 || pod.Volumes[0].Secret.SecretName != "{{ .ObjectMeta.Name }}-epp-federation" {
					t.Errorf("the picker's volumes %+v, want its service's Secret (a placeholder the controller renders)", pod.Volumes)
				}
			},
		},
		{
			name:   "every CRD subchart on",
			values: "crds: {gatewayAPI: {enabled: true}, leaderWorkerSet: {enabled: true}}",
			check: func(t *testing.T, r rendered) {
				got := r.kinds("CustomResourceDefinition")
				for _, want := range []string{"httproutes.gateway.networking.k8s.io", "gateways.gateway.networking.k8s.io",
					"leaderworkersets.leaderworkerset.x-k8s.io", "inferencepools.inference.networking.k8s.io"} {
					if !slices.Contains(got, want) {
						t.Errorf("CRDs %v lack %s", got, want)
					}
				}
			},
		},
		{
			name:   "every CRD subchart off leaves fleetinfer's own",
			values: "crds: {inferenceExtension: {enabled: false}}",
			check: func(t *testing.T, r rendered) {
				if got := r.kinds("CustomResourceDefinition"); !slices.Equal(got, ownCRDsPlus(t)) {
					t.Errorf("CRDs %v", got)
				}
			},
		},
		{
			name:   "an existing ServiceAccount, no RBAC, no metrics Service",
			values: "serviceAccount: {create: false, name: platform-sa}\nrbac: {create: false}\nmetrics: {service: {enabled: false}}",
			check: func(t *testing.T, r rendered) {
				if got := r.deployment(t).Spec.Template.Spec.ServiceAccountName; got != "platform-sa" {
					t.Errorf("service account %s", got)
				}
				for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service"} {
					if got := r.kinds(kind); len(got) != 0 {
						t.Errorf("%s %v rendered", kind, got)
					}
				}
			},
		},
		{
			name:   "a ServiceMonitor for prometheus-operator, and another default gateway",
			values: "metrics: {serviceMonitor: {enabled: true}}\ncontroller: {defaultGateway: gateways/public}",
			check: func(t *testing.T, r rendered) {
				if r["ServiceMonitor/"+release] == nil || !slices.Contains(r.args(t), "--default-gateway=gateways/public") {
					t.Errorf("ServiceMonitor %v args %v", r.kinds("ServiceMonitor"), r.args(t))
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.check(t, render(t, tt.values, tt.apiVersions...)) })
	}
}

// values.schema.json (checked by Helm before rendering) and the templates
// reject values that would install something broken, naming the problem.
func TestInvalidValuesAreRejected(t *testing.T) {
	tests := []struct {
		name, values, wantErr string
		apiVersions           []string
	}{
		{"unknown key", "replica: 2", "additional properties 'replica' not allowed", nil},
		{"negative replicas", "replicas: -1", "/replicas", nil},
		{"pull policy", "image: {pullPolicy: Sometimes}", "/image/pullPolicy", nil},
		{"gateway not namespace/name", "controller: {defaultGateway: gw}", "/controller/defaultGateway", nil},
		{"unknown federation address", "controller: {federationAddress: NodePort}", "/controller/federationAddress", nil},
		{"unknown preset source", "presets: {source: hub}", "/presets/source", nil},
		{"EPP flag without dashes", "epp: {extraArgs: [verbose]}", "/epp/extraArgs/0", nil},
		{"federation without a cluster name", "federation: {enabled: true}", "/federation/clusterName", nil},
		{"federation with controller-installed presets", "federation: {enabled: true, clusterName: east}\npresets: {source: controller}", "/presets/source", nil},
		{"unknown federation mode", "federation: {enabled: true, clusterName: east, mode: Mesh}", "/federation/mode", nil},
		{"cert-manager without an issuer", "federation: {enabled: true, clusterName: east, tls: {source: certManager, certManager: {namespaces: [llm]}}}", "/issuerRef/name", []string{certManager}},
		{"cert-manager with neither namespaces nor services", "federation: {enabled: true, clusterName: east, tls: {source: certManager, certManager: {issuerRef: {name: ca}}}}", "/federation/tls/certManager", []string{certManager}},
		{"cert-manager with both namespaces and services", "federation: {enabled: true, clusterName: east, tls: {source: certManager, certManager: {issuerRef: {name: ca}, namespaces: [llm], services: [{namespace: llm, name: llama}]}}}", "/federation/tls/certManager", []string{certManager}},
		{"cert-manager service without a namespace", "federation: {enabled: true, clusterName: east, tls: {source: certManager, certManager: {issuerRef: {name: ca}, services: [{name: llama}]}}}", "/federation/tls/certManager/services/0", []string{certManager}},
		{"cert-manager not installed", "federation: {enabled: true, clusterName: east, tls: {source: certManager, certManager: {issuerRef: {name: ca}, namespaces: [llm]}}}", "needs cert-manager", nil},
		{"ServiceMonitor without the Service", "metrics: {service: {enabled: false}, serviceMonitor: {enabled: true}}", "needs metrics.service.enabled", nil},
		{"existing ServiceAccount without a name", "serviceAccount: {create: false}", "serviceAccount.name is required", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := renderErr(tt.values, tt.apiVersions...)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want one containing %q", err, tt.wantErr)

			}
		})
	}
}

// The rendering depends only on the repository: two renderings are byte for
// byte the same (map order, file globbing), so CI and users get one result.
func TestRenderingIsReproducible(t *testing.T) {
	values := "federation: {enabled: true, clusterName: east}\ncrds: {gatewayAPI: {enabled: true}}"
	var out [2][]byte
	for i := range out {
		objs, err := renderErr(values)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			b, err := yaml.Marshal(o.Object)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = append(append(out[i], "---\n"...), b...)
		}
	}
	if !bytes.Equal(out[0], out[1]) {
		t.Error("two renderings differ")
	}
}

// helm lint passes without warnings, with default and federation values.
func TestChartLints(t *testing.T) {
	for _, values := range []map[string]any{nil, {"federation": map[string]any{"enabled": true, "clusterName": "east"}}} {
		res := action.NewLint().Run([]string{charts.Spoke}, values)
		for _, m := range res.Messages {
			if m.Severity > support.InfoSev {
				t.Errorf("lint %v: %s", values, m)
			}
		}
		for _, err := range res.Errors {
			t.Errorf("lint %v: %v", values, err)
		}
	}
}

// The dependencies Chart.yaml lists are the vendored CRD subcharts at their
// versions; a mismatch would make Helm ignore the condition and always
// install them.
func TestCRDSubchartsMatchTheirDependencies(t *testing.T) {
	c, err := charts.Load(charts.Spoke)
	if err != nil {
		t.Fatal(err)
	}
	vendored := map[string]*chart.Chart{}
	for _, d := range c.Dependencies() {
		vendored[d.Name()] = d
	}
	if len(vendored) != len(c.Metadata.Dependencies) {
		t.Errorf("%d subcharts vendored, %d listed", len(vendored), len(c.Metadata.Dependencies))
	}
	for _, dep := range c.Metadata.Dependencies {
		v := vendored[dep.Name]
		if v == nil || v.Metadata.Version != dep.Version || dep.Condition == "" || len(v.Templates) != 0 {
			t.Errorf("dependency %+v, vendored %+v", dep, v)
		}
	}
}
