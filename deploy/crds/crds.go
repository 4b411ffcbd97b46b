// Package crds embeds the CustomResourceDefinitions fleetinfer installs but
// does not own (GIE, LeaderWorkerSet, Gateway API, OCM, Cluster Inventory),
// copied verbatim from the pinned modules by hack/sync-crds.sh, and installs
// CRDs into a cluster.
package crds

import (
	"bufio"
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

//go:embed thirdparty/*.yaml
var thirdParty embed.FS

// API groups of the third-party CRDs, for choosing what a cluster gets.
const (
	GroupGIE           = "inference.networking.k8s.io"
	GroupGIEExperiment = "inference.networking.x-k8s.io"
	GroupLWS           = "leaderworkerset.x-k8s.io"
	GroupGateway       = "gateway.networking.k8s.io"
	GroupClusterInv    = "multicluster.x-k8s.io"
	GroupOCMCluster    = "cluster.open-cluster-management.io"
	GroupOCMWork       = "work.open-cluster-management.io"
	GroupOCMAddon      = "addon.open-cluster-management.io"
)

// ThirdParty returns the embedded CRDs of the given API groups.
func ThirdParty(groups ...string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	all, err := Parse(thirdParty, "thirdparty")
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, g := range groups {
		want[g] = true
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, c := range all {
		if want[c.Spec.Group] {
			out = append(out, c)
		}
	}
	return out, nil
}

// Parse reads every CRD in the YAML files of dir in fsys.
func Parse(fsys fs.FS, dir string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".yaml") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, n := range names {
		b, err := fs.ReadFile(fsys, path.Join(dir, n))
		if err != nil {
			return nil, err
		}
		docs, err := parseYAML(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		out = append(out, docs...)
	}
	return out, nil
}

func parseYAML(b []byte) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var out []*apiextensionsv1.CustomResourceDefinition
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(doc, crd); err != nil {
			return nil, err
		}
		if crd.Kind != "CustomResourceDefinition" {
			continue
		}
		out = append(out, crd)
	}
}

// Install creates or updates the CRDs and waits until the API server serves
// every one of them.
func Install(ctx context.Context, cfg *rest.Config, crds []*apiextensionsv1.CustomResourceDefinition) error {
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	api := cs.ApiextensionsV1().CustomResourceDefinitions()
	for _, c := range crds {
		_, err := api.Create(ctx, c.DeepCopy(), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			var cur *apiextensionsv1.CustomResourceDefinition
			if cur, err = api.Get(ctx, c.Name, metav1.GetOptions{}); err == nil {
				upd := c.DeepCopy()
				upd.ResourceVersion = cur.ResourceVersion
				_, err = api.Update(ctx, upd, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("install CRD %s: %w", c.Name, err)
		}
	}
	for _, c := range crds {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			cur, err := api.Get(ctx, c.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil //nolint:nilerr // keep polling through transient errors
			}
			for _, cond := range cur.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", c.Name, err)
		}
	}
	return nil
}
