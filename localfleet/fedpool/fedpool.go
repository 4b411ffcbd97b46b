// Package fedpool deploys one InferencePool across spokes of a local fleet,
// with fleetinfer's EPP as a pod in every cluster and the EPPs federated over
// mTLS through a peer directory written here (what the hub publishes in
// production): model-server pods of the simulator, the pool, its picker, a
// Service of type LoadBalancer for the picker's federation port (what the
// spoke creates by default, and what other clusters reach on isolated pod
// networks), and an HTTPRoute on each spoke's gateway with the same host
// everywhere, so that a request forwarded in Parent mode meets the pool
// again at the peer. The federation e2e tests and the routing benchmark
// share it.
package fedpool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/deploy/charts"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/kubelet"
	"github.com/fleetinfer/fleetinfer/localfleet/metrics"
)

// Ports of the pods, as GIE's chart and vLLM use them.
const (
	ModelPort      = 8000
	GRPCPort       = 9002
	HealthPort     = 9003
	MetricsPort    = 9090
	FederationPort = 9004
)

// ServiceAccount is the EPPs' ServiceAccount in the pool's namespace.
const ServiceAccount = "epp"

// Member is what one cluster runs of the pool.
type Member struct {
	// Replicas is the number of model-server pods; SimArgs are extra
	// simulator flags for them (their latency model and capacity).
	Replicas int32
	SimArgs  string
	// Mode is how the other clusters' EPPs reach this cluster's pods
	// (default Endpoint).
	Mode fleetv1alpha1.FederationMode

	Cluster  *fleet.Cluster
	Identity string
	// EPP is the picker's pod once Ready; Pods are the Ready model servers'
	// ip:port when Deploy returned.
	EPP  corev1.Pod
	Pods []string
	// FederationAddress is host:port of the picker's federation port on its
	// load balancer, the address the other clusters' pickers subscribe to.
	FederationAddress string
}

// EPPAddr is host:port of one of the picker pod's ports.
func (m *Member) EPPAddr(port int) string {
	return net.JoinHostPort(m.EPP.Status.PodIP, strconv.Itoa(port))
}

// GatewayAddr is host:port of the cluster gateway's listener, where clients'
// requests and those other clusters forward in Parent mode arrive alike.
func (m *Member) GatewayAddr() string {
	return strings.TrimPrefix(m.Cluster.GatewayURL(), "http://")
}

// EPPMetrics scrapes the picker's Prometheus endpoint into series → value.
func (m *Member) EPPMetrics(ctx context.Context) (map[string]float64, error) {
	return EPPMetrics(ctx, m.EPP)
}

// EPPMetrics scrapes a picker pod's Prometheus endpoint.
func EPPMetrics(ctx context.Context, epp corev1.Pod) (map[string]float64, error) {
	return metrics.Scrape(ctx, "http://"+net.JoinHostPort(epp.Status.PodIP, strconv.Itoa(MetricsPort))+"/metrics")
}

// Options describes the pool.
type Options struct {
	// Namespace is created in every member cluster.
	Namespace string
	// Pool names the InferencePool; its model servers carry label app=Pool.
	Pool    string
	Members []*Member
	// EPPConfig is the EndpointPickerConfig of every picker; empty for
	// fleetinfer's default.
	EPPConfig string
	// EPPArgs are extra flags for every picker.
	EPPArgs []string
	// Timeout bounds each wait (default 60 s).
	Timeout time.Duration
}

// Pool is a deployed pool.
type Pool struct {
	Options
	CA *federationtest.CA
}

// Host is the hostname the pool's HTTPRoute matches in every cluster.
func (p *Pool) Host() string { return Host(p.Pool, p.Namespace) }

// Host is the route hostname of a pool.
func Host(pool, ns string) string { return pool + "." + ns + ".test" }

// Member returns the member in the named cluster, or nil.
func (p *Pool) Member(cluster string) *Member {
	for _, m := range p.Members {
		if m.Cluster.Name() == cluster {
			return m
		}
	}
	return nil
}

// Deploy creates the pool in every member cluster and waits until each
// picker is Ready, each route accepted, every model server Ready and each
// picker holds its peers' pods.
func Deploy(ctx context.Context, o Options) (*Pool, error) {
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
	ca, err := federationtest.NewCA("fleetinfer-" + o.Namespace)
	if err != nil {
		return nil, err
	}
	p := &Pool{Options: o, CA: ca}
	for _, m := range o.Members {
		if m.Mode == "" {
			m.Mode = fleetv1alpha1.FederationEndpoint
		}
		m.Identity = "spiffe://fleetinfer.test/" + m.Cluster.Name() + "/epp"
		if err := p.create(ctx, m); err != nil {
			return nil, fmt.Errorf("%s: %w", m.Cluster.Name(), err)
		}
	}
	// The directory needs the pickers' load-balancer addresses, so it is
	// written once they are known; the pickers reload it.
	dir := fleetv1alpha1.PeerDirectory{}
	for _, m := range o.Members {
		if err := Wait(ctx, o.Timeout, m.Cluster.Name()+" EPP ready", func(ctx context.Context) error {
			if err := m.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: EPPName(o.Pool)}, &m.EPP); err != nil {
				return err
			}
			if m.EPP.Status.Phase == corev1.PodFailed {
				return Final(fmt.Errorf("EPP pod Failed: %s", TerminationMessage(&m.EPP)))
			}
			if !PodReady(&m.EPP) {
				return fmt.Errorf("EPP pod %s, containers %+v", m.EPP.Status.Phase, m.EPP.Status.ContainerStatuses)
			}
			var lb corev1.Service
			if err := m.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: fleetv1alpha1.FederationServiceName(o.Pool)}, &lb); err != nil {
				return err
			}
			if in := lb.Status.LoadBalancer.Ingress; len(in) > 0 && in[0].IP != "" {
				m.FederationAddress = net.JoinHostPort(in[0].IP, strconv.Itoa(FederationPort))
				return nil
			}
			return fmt.Errorf("federation Service %s has no load-balancer address", lb.Name)
		}); err != nil {
			return nil, err
		}
		dir.Peers = append(dir.Peers, fleetv1alpha1.Peer{Cluster: m.Cluster.Name(),
			Pool:              &fleetv1alpha1.PoolRef{Namespace: o.Namespace, Name: o.Pool},
			FederationAddress: m.FederationAddress, GatewayAddress: m.GatewayAddr(), Identity: m.Identity, Mode: m.Mode})
	}
	peers, err := yaml.Marshal(dir)
	if err != nil {
		return nil, err
	}
	for _, m := range o.Members {
		if err := RouteAccepted(ctx, m.Cluster, o.Namespace, o.Pool, o.Timeout); err != nil {
			return nil, err
		}
		cm := &corev1.ConfigMap{}
		if err := m.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: EPPName(o.Pool)}, cm); err != nil {
			return nil, err
		}
		cm.Data["peers.yaml"] = string(peers)
		if err := m.Cluster.Client.Update(ctx, cm); err != nil {
			return nil, err
		}
	}
	for _, m := range o.Members {
		if err := Wait(ctx, o.Timeout, m.Cluster.Name()+" model servers ready", func(ctx context.Context) error {
			m.Pods, err = ReadyPods(ctx, m.Cluster, o.Namespace, o.Pool)
			if err != nil {
				return err
			}
			if len(m.Pods) != int(m.Replicas) {
				return fmt.Errorf("%d of %d ready", len(m.Pods), m.Replicas)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	for _, m := range o.Members {
		if err := Wait(ctx, o.Timeout, m.Cluster.Name()+" EPP holds its peers' pods", func(ctx context.Context) error {
			got, err := m.EPPMetrics(ctx)
			if err != nil {
				return err
			}
			for _, peer := range o.Members {
				if peer == m {
					continue
				}
				want := float64(peer.Replicas)
				if n := got[`fleetinfer_epp_federation_remote_endpoints{peer="`+peer.Cluster.Name()+`"}`]; n != want {
					return fmt.Errorf("%s: %v remote endpoints, want %v", peer.Cluster.Name(), n, want)
				}
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (p *Pool) create(ctx context.Context, m *Member) error {
	ns := p.Namespace
	cert, key, err := p.CA.Issue(m.Identity)
	if err != nil {
		return err
	}
	epp, err := p.eppPod(m.Cluster.Name())
	if err != nil {
		return err
	}
	objs := []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}}
	objs = append(objs, EPPRBAC(ns)...)
	objs = append(objs,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "federation-tls", Namespace: ns},
			Data: map[string][]byte{"tls.crt": cert, "tls.key": key, "ca.crt": p.CA.PEM}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: EPPName(p.Pool), Namespace: ns},
			Data: map[string]string{"config.yaml": p.EPPConfig, "peers.yaml": "peers: []\n"}},
		ModelServer(ns, p.Pool, m.Replicas, m.SimArgs),
		InferencePool(ns, p.Pool, p.Pool, EPPName(p.Pool)),
		epp,
		EPPService(ns, EPPName(p.Pool)),
		federationService(ns, p.Pool),
		Route(ns, p.Pool, p.Host(), PoolRule(p.Pool)))
	for _, o := range objs {
		if err := client.IgnoreAlreadyExists(m.Cluster.Client.Create(ctx, o)); err != nil {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// EPPName names a pool's picker: its pod, Service and ConfigMap.
func EPPName(pool string) string { return pool + "-epp" }

// eppPod is a bare pod so that a killed picker stays dead, running the
// picker image the chart names.
func (p *Pool) eppPod(cluster string) (*corev1.Pod, error) {
	image, err := charts.Image("epp")
	if err != nil {
		return nil, err
	}
	var args []string
	if p.EPPConfig != "" {
		args = append(args, "--config-file=/etc/epp/config.yaml")
	}
	args = append(args, "--federation-cluster="+cluster, "--federation-port="+strconv.Itoa(FederationPort),
		"--federation-peers-file=/etc/epp/peers.yaml", "--federation-cert-file=/etc/federation/tls.crt",
		"--federation-key-file=/etc/federation/tls.key", "--federation-ca-file=/etc/federation/ca.crt")
	args = append(args, p.EPPArgs...)
	pod := EPPPod(p.Namespace, p.Pool, image, args...)
	c := &pod.Spec.Containers[0]
	c.Ports = append(c.Ports, corev1.ContainerPort{Name: fleetv1alpha1.FederationPortName, ContainerPort: FederationPort})
	c.VolumeMounts = []corev1.VolumeMount{{Name: "config", MountPath: "/etc/epp"}, {Name: "tls", MountPath: "/etc/federation"}}
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: EPPName(p.Pool)}}}},
		{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "federation-tls"}}},
	}
	return pod, nil
}

// EPPPod is a bare picker pod (a killed picker stays dead) for pool with
// GIE's flags for a local run, plus args.
func EPPPod(ns, pool, image string, args ...string) *corev1.Pod {
	name := EPPName(pool)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			ServiceAccountName: ServiceAccount, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "epp", Image: image,
				Args: append([]string{"--pool-name=" + pool, "--pool-namespace=" + ns,
					"--grpc-port=" + strconv.Itoa(GRPCPort), "--grpc-health-port=" + strconv.Itoa(HealthPort),
					"--metrics-port=" + strconv.Itoa(MetricsPort), "--secure-serving=false", "--tracing=false",
					"--metrics-endpoint-auth=false", "--enable-pprof=false", "--v=1"}, args...),
				Ports: []corev1.ContainerPort{{Name: "grpc", ContainerPort: GRPCPort}, {Name: "grpc-health", ContainerPort: HealthPort},
					{Name: "metrics", ContainerPort: MetricsPort}},
				ReadinessProbe: &corev1.Probe{PeriodSeconds: 2, ProbeHandler: corev1.ProbeHandler{
					GRPC: &corev1.GRPCAction{Port: HealthPort, Service: ptr.To("envoy.service.ext_proc.v3.ExternalProcessor")}}},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
}

// EPPService is the picker's Service, what the pool's endpointPickerRef names.
func EPPService(ns, name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "grpc", Port: GRPCPort, TargetPort: intstr.FromString("grpc")}}}}
}

// federationService exposes the picker's federation port on a load-balancer
// address, reachable from every cluster whatever the pod network, as the
// spoke does for a federated service (fleetv1alpha1.FederationServiceName).
func federationService(ns, pool string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fleetv1alpha1.FederationServiceName(pool), Namespace: ns},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": EPPName(pool)},
			Ports: []corev1.ServicePort{{Name: fleetv1alpha1.FederationPortName, Port: FederationPort,
				TargetPort: intstr.FromString(fleetv1alpha1.FederationPortName)}}}}
}

// EPPRBAC is what GIE's chart grants the picker: read its pool, the pods
// and the objectives and rewrites.
func EPPRBAC(ns string) []client.Object {
	return []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ServiceAccount, Namespace: ns}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: ServiceAccount, Namespace: ns}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"inference.networking.x-k8s.io"}, Resources: []string{"inferenceobjectives", "inferencemodelrewrites"}, Verbs: []string{"get", "list", "watch"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ServiceAccount, Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: ServiceAccount},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ServiceAccount, Namespace: ns}}},
	}
}

// ModelServer is a Deployment of simulator pods (label app=name) serving
// model "llama" on ModelPort; simArgs go to the simulator as they are.
func ModelServer(ns, name string, replicas int32, simArgs string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "vllm", Image: "vllm/vllm-openai:v0.11.0",
					Args:  []string{"llama", "--port", strconv.Itoa(ModelPort), "--max-model-len", "4096"},
					Env:   []corev1.EnvVar{{Name: kubelet.SimArgsEnv, Value: simArgs}},
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: ModelPort}},
					ReadinessProbe: &corev1.Probe{PeriodSeconds: 2, ProbeHandler: corev1.ProbeHandler{
						HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromString("http")}}},
				}}},
			},
		},
	}
}

// InferencePool selects the pods labelled app=app on ModelPort, picked by
// the EPP Service epp, failing open.
func InferencePool(ns, name, app, epp string) *inferencev1.InferencePool {
	return &inferencev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: inferencev1.InferencePoolSpec{
			Selector:    inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{"app": inferencev1.LabelValue(app)}},
			TargetPorts: []inferencev1.Port{{Number: ModelPort}},
			EndpointPickerRef: inferencev1.EndpointPickerRef{Name: inferencev1.ObjectName(epp), Port: &inferencev1.Port{Number: GRPCPort},
				FailureMode: inferencev1.EndpointPickerFailOpen},
		}}
}

// Route is an HTTPRoute on the spoke's Gateway for one hostname.
func Route(ns, name, host string, rules ...gatewayv1.HTTPRouteRule) *gatewayv1.HTTPRoute {
	return &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{
				Namespace: ptr.To(gatewayv1.Namespace(fleet.Namespace)), Name: fleet.GatewayName}}},
			Hostnames: []gatewayv1.Hostname{gatewayv1.Hostname(host)},
			Rules:     rules,
		},
	}
}

// PoolRule sends every path to an InferencePool.
func PoolRule(pool string) gatewayv1.HTTPRouteRule {
	return gatewayv1.HTTPRouteRule{
		Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To("/")}}},
		BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
			Group: ptr.To(gatewayv1.Group(inferencev1.GroupName)), Kind: ptr.To(gatewayv1.Kind("InferencePool")), Name: gatewayv1.ObjectName(pool)}}}},
	}
}

// RouteAccepted waits until the cluster's Gateway accepted route ns/name.
func RouteAccepted(ctx context.Context, c *fleet.Cluster, ns, name string, timeout time.Duration) error {
	return Wait(ctx, timeout, c.Name()+" route "+name+" accepted", func(ctx context.Context) error {
		var r gatewayv1.HTTPRoute
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &r); err != nil {
			return err
		}
		for _, p := range r.Status.Parents {
			if meta.IsStatusConditionTrue(p.Conditions, string(gatewayv1.RouteConditionAccepted)) {
				return nil
			}
		}
		return fmt.Errorf("route parents %+v", r.Status.Parents)
	})
}

// ReadyPods lists ip:port of the Ready pods labelled app=app.
func ReadyPods(ctx context.Context, c *fleet.Cluster, ns, app string) ([]string, error) {
	var pods corev1.PodList
	if err := c.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": app}); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range pods.Items {
		if PodReady(&p) && p.DeletionTimestamp == nil {
			out = append(out, net.JoinHostPort(p.Status.PodIP, strconv.Itoa(ModelPort)))
		}
	}
	return out, nil
}

// PodReady reports the pod's Ready condition.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TerminationMessage is what the kubelet reported of p's terminated
// containers: under FallbackToLogsOnError, a failed one's log tail.
func TerminationMessage(p *corev1.Pod) string {
	var out []string
	for _, c := range p.Status.ContainerStatuses {
		if t := c.State.Terminated; t != nil {
			out = append(out, fmt.Sprintf("%s exited %d: %s", c.Name, t.ExitCode, strings.TrimSpace(t.Message)))
		}
	}
	if len(out) == 0 {
		return "no container terminated"
	}
	return strings.Join(out, "; ")
}

// Wait retries check every 200 ms until it returns nil, or fails with the
// last error after timeout, or at once with an error marked Final.
func Wait(ctx context.Context, timeout time.Duration, what string, check func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		last := check(ctx)
		if last == nil {
			return nil
		}
		var final finalError
		if errors.As(last, &final) {
			return fmt.Errorf("%s: %w", what, final.error)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not true after %s: %w", what, timeout, errors.Join(last, ctx.Err()))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Final marks an error of a Wait check that no retry can change, such as a
// bare pod that Failed (nothing restarts it), so that Wait returns it at
// once instead of at the timeout.
func Final(err error) error { return finalError{err} }

type finalError struct{ error }

func (e finalError) Unwrap() error { return e.error }
