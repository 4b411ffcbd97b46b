// Package presets holds the well-known LLMInferenceServiceConfigs the spoke
// controller composes services from (named as KServe's, with a configurable
// prefix, "kserve-" by default): single-node, prefill and decode templates,
// data- and pipeline-parallel multi-node workers, the scheduler and the
// route. The spoke installs them into its system namespace at start-up so
// they always match the controller; the Helm chart ships the same files.
package presets

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/yaml"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

//go:embed configs/*.yaml
var files embed.FS

// ManagedByLabel marks presets the spoke installed (and may overwrite).
const ManagedByLabel = "app.kubernetes.io/managed-by"

// Load returns the presets, named with prefix, in namespace.
func Load(namespace, prefix string) ([]*v1alpha2.LLMInferenceServiceConfig, error) {
	names, err := fs.Glob(files, "configs/*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]*v1alpha2.LLMInferenceServiceConfig, 0, len(names))
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			return nil, err
		}
		cfg := &v1alpha2.LLMInferenceServiceConfig{}
		if err := yaml.UnmarshalStrict(b, cfg); err != nil {
			return nil, fmt.Errorf("preset %s: %w", path.Base(n), err)
		}
		if want := strings.TrimSuffix(path.Base(n), ".yaml"); cfg.Name != want {
			return nil, fmt.Errorf("preset %s is named %q", n, cfg.Name)
		}
		cfg.Name, cfg.Namespace = prefix+cfg.Name, namespace
		cfg.Labels = map[string]string{ManagedByLabel: "fleetinfer-spoke"}
		out = append(out, cfg)
	}
	return out, nil
}

// Install needs these rights only in the system namespace (a Role, bound
// only where the spoke installs the presets itself; the Helm chart installs
// them and runs the spoke with --install-presets=false).
// +kubebuilder:rbac:groups=serving.kserve.io,resources=llminferenceserviceconfigs,verbs=get;create;update,namespace=fleetinfer-system

// Install creates or updates the presets in namespace.
func Install(ctx context.Context, c client.Client, namespace, prefix string) error {
	cfgs, err := Load(namespace, prefix)
	if err != nil {
		return err
	}
	for _, want := range cfgs {
		cur := &v1alpha2.LLMInferenceServiceConfig{ObjectMeta: want.ObjectMeta}
		cur.ObjectMeta.Labels = nil
		if _, err := controllerutil.CreateOrUpdate(ctx, c, cur, func() error {
			if cur.Labels == nil {
				cur.Labels = map[string]string{}
			}
			for k, v := range want.Labels {
				cur.Labels[k] = v
			}
			if !equality.Semantic.DeepEqual(cur.Spec, want.Spec) {
				cur.Spec = want.Spec
			}
			return nil
		}); err != nil {
			return fmt.Errorf("install preset %s/%s: %w", namespace, want.Name, err)
		}
	}
	return nil
}
