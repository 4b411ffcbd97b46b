// Package spoke assembles the spoke controller: the LLMInferenceService
// reconciler, the well-known presets it composes from, and the cluster
// capacity report.
package spoke

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/spoke/capacity"
	"github.com/fleetinfer/fleetinfer/spoke/llmisvc"
	"github.com/fleetinfer/fleetinfer/spoke/presets"
)

// Scheme knows every API the spoke reads or writes.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(v1alpha2.AddToScheme(Scheme))
	utilruntime.Must(igwapiv1.Install(Scheme))
	utilruntime.Must(igwapixv1alpha1.Install(Scheme))
	utilruntime.Must(gwapiv1.Install(Scheme))
	utilruntime.Must(lwsv1.AddToScheme(Scheme))
	utilruntime.Must(fleetv1alpha1.AddToScheme(Scheme))
}

// ManagerOptions completes a manager's options for the spoke: its scheme and
// a cache that keeps pods small (see capacity.CacheOptions).
func ManagerOptions(o ctrl.Options) ctrl.Options {
	o.Scheme = Scheme
	o.Cache.ByObject = capacity.CacheOptions()
	return o
}

// Options configure the spoke.
type Options struct {
	llmisvc.Options
	// InstallPresets writes the well-known presets into the system
	// namespace before the controllers start.
	InstallPresets bool
}

// Setup installs the presets and registers the spoke's controllers with mgr.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Options) error {
	if opts.InstallPresets {
		// The manager's cache is not running yet; write directly.
		c, err := client.New(mgr.GetConfig(), client.Options{Scheme: Scheme})
		if err != nil {
			return err
		}
		ns := &corev1.Namespace{}
		ns.Name = opts.SystemNamespace
		// Without cluster-wide rights on namespaces (the Helm chart grants
		// none) the create is forbidden even when the namespace exists; the
		// presets' own create then says whether it does.
		if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) && !apierrors.IsForbidden(err) {
			return fmt.Errorf("system namespace: %w", err)
		}
		if err := presets.Install(ctx, c, opts.SystemNamespace, opts.PresetPrefix); err != nil {
			return err
		}
	}
	r := llmisvc.NewReconciler(mgr.GetClient(), mgr.GetEventRecorderFor("llminferenceservice-controller"), opts.Options)
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&llmisvc.ImportReconciler{Reconciler: r}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&capacity.Reconciler{Client: mgr.GetClient()}).SetupWithManager(mgr)
}
