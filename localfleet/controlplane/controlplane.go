// Package controlplane runs a real Kubernetes control plane on this machine:
// etcd, kube-apiserver and, optionally, kube-controller-manager and
// kube-scheduler, all bound to 127.0.0.1 on free ports, with their state in one
// directory so that a stopped control plane can be started again with its
// data, as a real cluster comes back after an outage.
package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/fleetinfer/fleetinfer/localfleet/ports"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

// Binaries locates the executables of a control plane.
type Binaries struct {
	Etcd                  string
	KubeAPIServer         string
	KubeControllerManager string
	KubeScheduler         string
}

// Options configures a control plane.
type Options struct {
	// Name labels logs and certificates, e.g. "hub" or "spoke-a".
	Name string
	// Dir holds etcd data, certificates, kubeconfigs and logs.
	Dir      string
	Binaries Binaries
	Registry *process.Registry
	// ControllerManager runs kube-controller-manager (garbage collection,
	// Deployments, ReplicaSets, namespaces, service accounts).
	ControllerManager bool
	// Controllers overrides kube-controller-manager's --controllers, e.g.
	// garbage collection without the Deployment controller, for tests that
	// set workload status themselves.
	Controllers string
	// Scheduler runs kube-scheduler, which binds pods to the fake nodes.
	Scheduler bool
	// AuditUsers are users whose writes (create, update, patch, delete)
	// the API server records in AuditLog(), so tests can count them.
	AuditUsers []string
	// ServingIPs are further addresses the API server's certificate is
	// valid for, besides its own: a proxy in front of it (the link the hub
	// reaches a spoke through).
	ServingIPs []net.IP
}

// Admin identity of the fleet's own tooling.
const (
	AdminUser  = "fleet-admin"
	AdminGroup = "system:masters"
)

// StopGrace is how long a component gets after SIGTERM before SIGKILL.
// kube-apiserver can take more than 10 s to drain on SIGTERM, which would make
// every test teardown slow; nothing here needs a graceful drain.
const StopGrace = 2 * time.Second

// controllers run by kube-controller-manager. The legacy token controller needs
// a signing key the fleet does not hand out; the endpoint controllers are off
// because the API server rejects loopback addresses in Endpoints and
// EndpointSlices, and every pod address here is a loopback address (the local
// gateway resolves Services to pods itself).
const controllers = "*,-serviceaccount-token,-endpoint,-endpointslice,-endpointslicemirroring"

// ControlPlane is one cluster's control plane.
type ControlPlane struct {
	opts      Options
	host      string
	apiPort   int
	etcdPort  int
	peerPort  int
	ca        *authority
	admin     *rest.Config
	adminPath string

	mu    sync.Mutex
	procs []*process.Process // in start order
}

// New prepares directories, ports and certificates without starting anything.
func New(opts Options) (*ControlPlane, error) {
	if opts.Registry == nil {
		return nil, errors.New("controlplane: a process registry is required")
	}
	c := &ControlPlane{opts: opts, host: "127.0.0.1"}
	for _, d := range []string{c.path("etcd"), c.path("pki"), c.path("logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	free, err := ports.Free(3)
	if err != nil {
		return nil, err
	}
	c.apiPort, c.etcdPort, c.peerPort = free[0], free[1], free[2]
	if c.ca, err = newAuthority(opts.Name); err != nil {
		return nil, err
	}
	if err := c.writePKI(); err != nil {
		return nil, err
	}
	if c.admin, err = c.UserConfig(AdminUser, AdminGroup); err != nil {
		return nil, err
	}
	c.adminPath = c.path("admin.kubeconfig")
	if err := WriteKubeconfig(c.adminPath, opts.Name, c.admin); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *ControlPlane) path(elem ...string) string {
	return filepath.Join(append([]string{c.opts.Dir}, elem...)...)
}

func (c *ControlPlane) writePKI() error {
	serving, err := c.ca.serving(c.host, c.opts.ServingIPs...)
	if err != nil {
		return err
	}
	saKey, saPub, err := signingKey()
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"ca.crt": c.ca.certPEM, "apiserver.crt": serving.Cert, "apiserver.key": serving.Key,
		"sa.key": saKey, "sa.pub": saPub,
	}
	for name, data := range files {
		if err := os.WriteFile(c.path("pki", name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// Name is the cluster's name.
func (c *ControlPlane) Name() string { return c.opts.Name }

// Dir is the control plane's state directory.
func (c *ControlPlane) Dir() string { return c.opts.Dir }

// URL is the API server's address.
func (c *ControlPlane) URL() string {
	return "https://" + net.JoinHostPort(c.host, strconv.Itoa(c.apiPort))
}

// Admin is a rest.Config for a system:masters user.
func (c *ControlPlane) Admin() *rest.Config { return rest.CopyConfig(c.admin) }

// AdminKubeconfig is the path of a kubeconfig file for the admin user.
func (c *ControlPlane) AdminKubeconfig() string { return c.adminPath }

// CACert is the PEM certificate of the cluster's CA.
func (c *ControlPlane) CACert() []byte { return c.ca.certPEM }

// UserConfig returns a rest.Config that authenticates as user in groups with a
// client certificate signed by the cluster's CA.
func (c *ControlPlane) UserConfig(user string, groups ...string) (*rest.Config, error) {
	kp, err := c.ca.client(user, groups)
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host: c.URL(),
		TLSClientConfig: rest.TLSClientConfig{
			CAData: c.ca.certPEM, CertData: kp.Cert, KeyData: kp.Key,
		},
		QPS: 200, Burst: 400,
	}, nil
}

// Start launches the components and waits until the API server is ready.
// Calling Start on a stopped control plane brings it back with its data.
func (c *ControlPlane) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.procs) > 0 {
		return fmt.Errorf("controlplane %s: already running", c.opts.Name)
	}
	if err := c.startEtcd(ctx); err != nil {
		c.stopLocked()
		return err
	}
	if err := c.startAPIServer(ctx); err != nil {
		c.stopLocked()
		return err
	}
	if c.opts.ControllerManager {
		ctrls := c.opts.Controllers
		if ctrls == "" {
			ctrls = controllers
		}
		if err := c.startComponent("kube-controller-manager", c.opts.Binaries.KubeControllerManager,
			"--controllers="+ctrls,
			"--use-service-account-credentials=false",
			"--root-ca-file="+c.path("pki", "ca.crt"),
			"--kube-api-qps=200", "--kube-api-burst=400",
			"--concurrent-deployment-syncs=10", "--concurrent-replicaset-syncs=10",
			"--concurrent-gc-syncs=20",
		); err != nil {
			c.stopLocked()
			return err
		}
	}
	if c.opts.Scheduler {
		if err := c.startComponent("kube-scheduler", c.opts.Binaries.KubeScheduler,
			"--kube-api-qps=200", "--kube-api-burst=400",
		); err != nil {
			c.stopLocked()
			return err
		}
	}
	return nil
}

func (c *ControlPlane) start(name, bin string, args ...string) (*process.Process, error) {
	if bin == "" {
		return nil, fmt.Errorf("controlplane %s: no binary configured for %s", c.opts.Name, name)
	}
	p, err := process.Start(process.Spec{
		Name:    c.opts.Name + "/" + name,
		Path:    bin,
		Args:    args,
		LogPath: c.path("logs", name+".log"),
	}, c.opts.Registry)
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, p)
	return p, nil
}

func (c *ControlPlane) startEtcd(ctx context.Context) error {
	client := "http://" + net.JoinHostPort(c.host, strconv.Itoa(c.etcdPort))
	peer := "http://" + net.JoinHostPort(c.host, strconv.Itoa(c.peerPort))
	p, err := c.start("etcd", c.opts.Binaries.Etcd,
		"--name=default",
		"--data-dir="+c.path("etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=default="+peer,
		// Test clusters need no durability across a machine crash; fsync
		// dominates etcd's latency on shared disks.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	return WaitHTTP(ctx, p, http.DefaultClient, client+"/health", 30*time.Second)
}

func (c *ControlPlane) startAPIServer(ctx context.Context) error {
	pki := func(f string) string { return c.path("pki", f) }
	args := []string{
		"--etcd-servers=http://" + net.JoinHostPort(c.host, strconv.Itoa(c.etcdPort)),
		"--bind-address=" + c.host, "--advertise-address=" + c.host,
		"--secure-port=" + strconv.Itoa(c.apiPort),
		"--tls-cert-file=" + pki("apiserver.crt"), "--tls-private-key-file=" + pki("apiserver.key"),
		"--client-ca-file=" + pki("ca.crt"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=" + c.URL(),
		"--service-account-key-file=" + pki("sa.pub"),
		"--service-account-signing-key-file=" + pki("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--allow-privileged=true",
		// The apiserver would publish its own loopback address in the
		// "kubernetes" Endpoints, which validation rejects.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
		"--cert-dir=" + c.path("pki"),
	}
	if len(c.opts.AuditUsers) > 0 {
		policy, err := auditPolicy(c.opts.AuditUsers)
		if err != nil {
			return err
		}
		if err := os.WriteFile(c.path("audit-policy.yaml"), policy, 0o600); err != nil {
			return err
		}
		args = append(args, "--audit-policy-file="+c.path("audit-policy.yaml"),
			"--audit-log-path="+c.AuditLog(), "--audit-log-format=json", "--audit-log-maxbackup=1")
	}
	p, err := c.start("kube-apiserver", c.opts.Binaries.KubeAPIServer, args...)
	if err != nil {
		return err
	}
	rc, err := rest.HTTPClientFor(c.admin)
	if err != nil {
		return err
	}
	return WaitHTTP(ctx, p, rc, c.URL()+"/readyz", 60*time.Second)
}

// RestartAPIServer stops the API server alone (SIGTERM, then SIGKILL after
// StopGrace) and starts a new one on the same address and data, as a
// rolling upgrade or a crash of that one process does; etcd and the other
// components keep running. It returns when the new one is ready.
func (c *ControlPlane) RestartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.IndexFunc(c.procs, func(p *process.Process) bool { return p.Name == c.opts.Name+"/kube-apiserver" })
	if i < 0 {
		return fmt.Errorf("controlplane %s: the API server is not running", c.opts.Name)
	}
	c.procs[i].Stop(StopGrace)
	c.procs = slices.Delete(c.procs, i, i+1)
	return c.startAPIServer(ctx)
}

// startComponent runs a controller binary against this API server as the
// admin user, without serving its own HTTPS endpoint.
func (c *ControlPlane) startComponent(name, bin string, args ...string) error {
	kubeconfig := c.path(name + ".kubeconfig")
	cfg, err := c.UserConfig("system:"+name, AdminGroup)
	if err != nil {
		return err
	}
	if err := WriteKubeconfig(kubeconfig, c.opts.Name, cfg); err != nil {
		return err
	}
	_, err = c.start(name, bin, append([]string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
	}, args...)...)
	return err
}

// AuditLog is the path of the API server's audit log (see Options.AuditUsers).
func (c *ControlPlane) AuditLog() string { return c.path("logs", "audit.log") }

// auditPolicy records the writes of the given users and nothing else.
func auditPolicy(users []string) ([]byte, error) {
	policy := map[string]any{
		"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": []string{"RequestReceived"},
		"rules": []any{
			map[string]any{"level": "Metadata", "users": users, "verbs": []string{"create", "update", "patch", "delete", "deletecollection"}},
			map[string]any{"level": "None"},
		},
	}
	return json.Marshal(policy)
}

// Running reports whether the control plane's processes are up.
func (c *ControlPlane) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.procs) > 0
}

// Stop stops every component, newest first (controllers, then the API server,
// then etcd), keeping the data directory so Start can bring it back.
func (c *ControlPlane) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopLocked()
}

func (c *ControlPlane) stopLocked() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].Stop(StopGrace)
	}
	c.procs = nil
}

// Clientset returns a typed client for the admin user.
func (c *ControlPlane) Clientset() (*kubernetes.Clientset, error) {
	return kubernetes.NewForConfig(c.admin)
}

// WaitHTTP polls url until it answers 200, the process exits, or the timeout
// passes.
func WaitHTTP(ctx context.Context, p *process.Process, hc *http.Client, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s answered %s", url, resp.Status)
		}
		last = err
		select {
		case <-p.Done():
			return fmt.Errorf("%s exited before it was ready (%v); see %s", p.Name, p.ExitErr(), p.LogPath)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %v; see %s", p.Name, timeout, last, p.LogPath)
		case <-tick.C:
		}
	}
}

// Kubeconfig renders cfg (certificate or token authentication) as a
// kubeconfig with one context named after the cluster.
func Kubeconfig(cluster string, cfg *rest.Config) ([]byte, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters[cluster] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[cluster] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken,
	}
	kc.Contexts[cluster] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: cluster}
	kc.CurrentContext = cluster
	return clientcmd.Write(*kc)
}

// WriteKubeconfig writes Kubeconfig(cluster, cfg) to path.
func WriteKubeconfig(path, cluster string, cfg *rest.Config) error {
	b, err := Kubeconfig(cluster, cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
