// Package clusterprofile is a multicluster-runtime provider that engages the
// clusters of a Cluster Inventory API ClusterSet: every ClusterProfile
// (multicluster.x-k8s.io/v1alpha1) in one namespace of the hub becomes a
// cluster of the same name.
//
// Credentials come from the KEP-5339 access providers the profile lists
// (status.accessProviders, or the deprecated credentialProviders) when the
// hub is configured with an exec plugin for one of them, and otherwise from
// the Secret the upstream provider reads: in the profile's namespace,
// labelled x-k8s.io/cluster-inventory-consumer=<consumer> and
// x-k8s.io/cluster-profile=<profile>, a kubeconfig under key Config.
//
// A profile is engaged as soon as its credentials build, healthy or not:
// the hub's inventory reads ControlPlaneHealthy itself and gives an
// unhealthy cluster its failover toleration, which disengaging would skip.
package clusterprofile

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	clusterinventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/cluster-inventory-api/pkg/access"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/multicluster-runtime/pkg/clusters"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
)

// The Secret strategy's contract, as multicluster-runtime's
// cluster-inventory-api provider reads it.
const (
	ConsumerLabel = "x-k8s.io/cluster-inventory-consumer"
	ProfileLabel  = "x-k8s.io/cluster-profile"
	SecretKey     = "Config"
)

// Reasons of the Events the provider records on a ClusterProfile.
const (
	ReasonEngaged            = "ClusterEngaged"
	ReasonInvalidName        = "InvalidClusterName"
	ReasonNoCredentials      = "NoCredentials"
	ReasonInvalidCredentials = "InvalidCredentials"
	ReasonEngageFailed       = "EngageFailed"
)

// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=clusterprofiles,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=fleetinfer-system,resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Options configure the provider.
type Options struct {
	// Namespace is the ClusterSet's namespace: its ClusterProfiles are the
	// clusters; profiles elsewhere are ignored.
	Namespace string
	// Consumer names this hub in the Secret strategy's consumer label.
	Consumer string
	// Access holds the exec plugins of the access providers the hub can
	// use (the JSON of --clusterprofile-provider-file); nil leaves only the
	// Secret strategy.
	Access *access.Config
	// CheckKubeconfig, when set, refuses a kubeconfig Secret's config (the
	// hub's policy on exec plugins and files); the access providers' exec
	// plugins are the operator's own configuration and are not checked.
	CheckKubeconfig func(*rest.Config) error
	// RESTOptions adjust every cluster's rest.Config (for example its
	// client rate limits) before it is engaged.
	RESTOptions []func(*rest.Config) error
	// ClusterOptions apply to every engaged cluster.
	ClusterOptions []cluster.Option
}

var engagedGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "fleetinfer_hub_clusterprofile_engaged",
	Help: "Whether the ClusterProfile of a cluster is engaged (1) or refused for its name or credentials (0).",
}, []string{"cluster"})

func init() {
	ctrlmetrics.Registry.MustRegister(engagedGauge)
}

var _ multicluster.Provider = &Provider{}

// Provider engages the clusters of a ClusterSet's ClusterProfiles.
type Provider struct {
	opts     Options
	ctx      context.Context
	hub      client.Client
	aware    multicluster.Aware
	recorder record.EventRecorder
	clusters clusters.Clusters[*engaged]

	mu      sync.Mutex
	current map[string]*engaged
	seq     uint64
}

// engaged is one engagement of a cluster. clusters.Clusters stores it under
// a key unique to the engagement, not under the cluster's name: when a
// cluster stops, Clusters removes whatever its key names, and under the
// plain name that would be the engagement that replaced it after a
// credential change.
type engaged struct {
	cluster.Cluster
	key  multicluster.ClusterName
	hash string
}

// New returns a provider; SetupWithManager starts it.
func New(opts Options) *Provider {
	p := &Provider{opts: opts, clusters: clusters.New[*engaged](), current: map[string]*engaged{}}
	p.clusters.ErrorHandler = func(err error, msg string, kv ...any) {
		log.Log.WithName("clusterprofile-provider").Error(err, msg, kv...)
	}
	return p
}

// Get returns the engaged cluster of that name.
func (p *Provider) Get(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error) {
	if e := p.engagement(ctx, string(name)); e != nil {
		return e, nil
	}
	return nil, multicluster.ErrClusterNotFound
}

// IndexField indexes a field on every engaged cluster, current and future.
func (p *Provider) IndexField(ctx context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	return p.clusters.IndexField(ctx, obj, field, extract)
}

// SetupWithManager runs the provider's controller on mgr's local (hub)
// manager; engaged clusters run until ctx ends or they are disengaged.
func (p *Provider) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	if p.opts.Namespace == "" || p.opts.Consumer == "" {
		return errors.New("clusterprofile provider: a namespace and a consumer name are required")
	}
	local := mgr.GetLocalManager()
	p.ctx, p.aware, p.hub = ctx, mgr, local.GetClient()
	p.recorder = local.GetEventRecorderFor("fleetinfer-hub")
	inNamespace := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetNamespace() == p.opts.Namespace })
	return ctrl.NewControllerManagedBy(local).
		Named("clusterprofile-provider").
		For(&clusterinventoryv1alpha1.ClusterProfile{}, builder.WithPredicates(inNamespace)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(p.profileOfSecret), builder.WithPredicates(inNamespace)).
		// Engaging waits for a cluster's caches; one unreachable member
		// must not hold up the others.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(p)
}

// profileOfSecret maps a Secret of the Secret strategy to its profile.
func (p *Provider) profileOfSecret(_ context.Context, o client.Object) []reconcile.Request {
	l := o.GetLabels()
	if l[ConsumerLabel] != p.opts.Consumer || l[ProfileLabel] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: l[ProfileLabel]}}}
}

// Reconcile engages, re-engages or disengages one profile's cluster.
func (p *Provider) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx).WithValues("cluster", req.Name)
	cp := &clusterinventoryv1alpha1.ClusterProfile{}
	if err := p.hub.Get(ctx, req.NamespacedName, cp); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		if p.disengage(req.Name) {
			logger.Info("ClusterProfile deleted: cluster disengaged")
		}
		engagedGauge.DeleteLabelValues(req.Name)
		return ctrl.Result{}, nil
	}
	if !cp.DeletionTimestamp.IsZero() {
		if p.disengage(req.Name) {
			logger.Info("ClusterProfile is being deleted: cluster disengaged")
		}
		return ctrl.Result{}, nil
	}
	if problem := nameProblem(cp.Name); problem != "" {
		p.refuse(ctx, cp, ReasonInvalidName, "not engaged: the cluster name %q %s", cp.Name, problem)
		return ctrl.Result{}, nil
	}
	cfg, hash, err := p.credentials(ctx, cp)
	var ce *credentialError
	if errors.As(err, &ce) {
		p.refuse(ctx, cp, ce.reason, "not engaged: %s", ce.msg)
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if cur := p.engagement(ctx, cp.Name); cur != nil && cur.hash == hash {
		return ctrl.Result{}, nil
	}
	if p.disengage(cp.Name) {
		logger.Info("credentials changed: re-engaging the cluster")
	}
	if err := p.engage(cp.Name, cfg, hash); err != nil {
		engagedGauge.WithLabelValues(cp.Name).Set(0)
		p.recorder.Eventf(cp, corev1.EventTypeWarning, ReasonEngageFailed, "engaging cluster %s failed (retrying): %v", cp.Name, err)
		return ctrl.Result{}, err
	}
	engagedGauge.WithLabelValues(cp.Name).Set(1)
	logger.Info("cluster engaged", "server", cfg.Host)
	p.recorder.Eventf(cp, corev1.EventTypeNormal, ReasonEngaged, "cluster %s engaged (API server %s)", cp.Name, cfg.Host)
	return ctrl.Result{}, nil
}

// refuse disengages a profile's cluster for the reason given and says why
// on the profile and in the log.
func (p *Provider) refuse(ctx context.Context, cp *clusterinventoryv1alpha1.ClusterProfile, reason, format string, args ...any) {
	p.disengage(cp.Name)
	engagedGauge.WithLabelValues(cp.Name).Set(0)
	msg := fmt.Sprintf(format, args...)
	log.FromContext(ctx).Info("ClusterProfile refused", "cluster", cp.Name, "reason", reason, "message", msg)
	p.recorder.Event(cp, corev1.EventTypeWarning, reason, msg)
}

// nameProblem says why a profile's name cannot name a cluster, or "": the
// hub puts cluster names into placements and SPIFFE IDs, where only a DNS
// label fits.
func nameProblem(name string) string {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return "is not a DNS-1123 label: " + strings.Join(errs, "; ")
	}
	return ""
}

// credentialError is a profile's own problem: retrying will not help until
// the profile or its Secret changes, which the watches notice.
type credentialError struct{ reason, msg string }

func (e *credentialError) Error() string { return e.msg }

func refusal(reason, format string, args ...any) error {
	return &credentialError{reason: reason, msg: fmt.Sprintf(format, args...)}
}

// credentials builds the profile's rest.Config and a hash of what it was
// built from, so that a change of credentials re-engages the cluster.
func (p *Provider) credentials(ctx context.Context, cp *clusterinventoryv1alpha1.ClusterProfile) (*rest.Config, string, error) {
	if ap := accessProviderFor(p.opts.Access, cp); ap != nil {
		cfg, err := p.opts.Access.BuildConfigFromCP(cp)
		if err != nil {
			return nil, "", refusal(ReasonInvalidCredentials, "access provider %q: %v", ap.Name, err)
		}
		b, err := json.Marshal(ap)
		if err != nil {
			return nil, "", err
		}
		return cfg, hashOf("access-provider", b), nil
	}
	var secrets corev1.SecretList
	if err := p.hub.List(ctx, &secrets, client.InNamespace(cp.Namespace),
		client.MatchingLabels{ConsumerLabel: p.opts.Consumer, ProfileLabel: cp.Name}); err != nil {
		return nil, "", err
	}
	selector := fmt.Sprintf("%s=%s,%s=%s", ConsumerLabel, p.opts.Consumer, ProfileLabel, cp.Name)
	switch len(secrets.Items) {
	case 0:
		return nil, "", refusal(ReasonNoCredentials, "no access provider the hub knows (%s) in status.accessProviders and no Secret labelled %s in %s",
			p.knownProviders(), selector, cp.Namespace)
	case 1:
	default:
		return nil, "", refusal(ReasonInvalidCredentials, "%d Secrets labelled %s in %s; expected one", len(secrets.Items), selector, cp.Namespace)
	}
	sec := &secrets.Items[0]
	kc := sec.Data[SecretKey]
	if len(kc) == 0 {
		return nil, "", refusal(ReasonInvalidCredentials, "Secret %s/%s has no kubeconfig under key %s", sec.Namespace, sec.Name, SecretKey)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kc)
	if err != nil {
		return nil, "", refusal(ReasonInvalidCredentials, "Secret %s/%s: kubeconfig under key %s: %v", sec.Namespace, sec.Name, SecretKey, err)
	}
	if p.opts.CheckKubeconfig != nil {
		if err := p.opts.CheckKubeconfig(cfg); err != nil {
			return nil, "", refusal(ReasonInvalidCredentials, "Secret %s/%s: %v", sec.Namespace, sec.Name, err)
		}
	}
	return cfg, hashOf("secret", kc), nil
}

func (p *Provider) knownProviders() string {
	if p.opts.Access == nil || len(p.opts.Access.Providers) == 0 {
		return "none configured"
	}
	names := make([]string, len(p.opts.Access.Providers))
	for i, ap := range p.opts.Access.Providers {
		names[i] = ap.Name
	}
	return strings.Join(names, ", ")
}

// accessProviderFor is the access provider of the profile that
// BuildConfigFromCP would use: the first one cfg has a plugin for, an
// accessProviders entry winning over a deprecated credentialProviders one of
// the same name. nil when there is none.
func accessProviderFor(cfg *access.Config, cp *clusterinventoryv1alpha1.ClusterProfile) *clusterinventoryv1alpha1.AccessProvider {
	if cfg == nil {
		return nil
	}
	for _, known := range cfg.Providers {
		for _, list := range [][]clusterinventoryv1alpha1.AccessProvider{cp.Status.AccessProviders, cp.Status.CredentialProviders} {
			for i := range list {
				if list[i].Name == known.Name {
					return &list[i]
				}
			}
		}
	}
	return nil
}

func hashOf(source string, b []byte) string {
	h := sha256.New()
	h.Write([]byte(source))
	h.Write([]byte{0})
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// engagement is the cluster engaged under name, if it still runs.
func (p *Provider) engagement(ctx context.Context, name string) *engaged {
	p.mu.Lock()
	e := p.current[name]
	p.mu.Unlock()
	if e == nil {
		return nil
	}
	if _, err := p.clusters.GetTyped(ctx, e.key); err != nil {
		return nil // it stopped on its own (its caches failed)
	}
	return e
}

// engage starts a cluster, waits for its caches and engages it with the
// manager under the profile's name.
func (p *Provider) engage(name string, cfg *rest.Config, hash string) error {
	for _, o := range p.opts.RESTOptions {
		if err := o(cfg); err != nil {
			return err
		}
	}
	cl, err := cluster.New(cfg, p.opts.ClusterOptions...)
	if err != nil {
		return err
	}
	// Controllers may ask for the cluster as soon as it is engaged, before
	// Add returns: it is current from the start.
	p.mu.Lock()
	p.seq++
	e := &engaged{Cluster: cl, key: multicluster.ClusterName(fmt.Sprintf("%s#%d", name, p.seq)), hash: hash}
	p.current[name] = e
	p.mu.Unlock()
	underName := awareFunc(func(ctx context.Context, _ multicluster.ClusterName, c cluster.Cluster) error {
		return p.aware.Engage(ctx, multicluster.ClusterName(name), c)
	})
	if err := p.clusters.Add(p.ctx, e.key, e, underName); err != nil {
		p.mu.Lock()
		if p.current[name] == e {
			delete(p.current, name)
		}
		p.mu.Unlock()
		return err
	}
	return nil
}

// disengage stops the cluster engaged under name; it reports whether there
// was one.
func (p *Provider) disengage(name string) bool {
	p.mu.Lock()
	e := p.current[name]
	delete(p.current, name)
	p.mu.Unlock()
	if e == nil {
		return false
	}
	p.clusters.Remove(e.key)
	return true
}

type awareFunc func(context.Context, multicluster.ClusterName, cluster.Cluster) error

func (f awareFunc) Engage(ctx context.Context, name multicluster.ClusterName, cl cluster.Cluster) error {
	return f(ctx, name, cl)
}
