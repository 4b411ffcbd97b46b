// Package binaries finds the executables the local fleet runs: the control
// plane and simulator built by `make tools` under bin/<tool>-<version>/, with
// the version read from the tool's pinning module under hack/tools, and
// fleetinfer's images, which `make images` writes as an OCI image layout
// to bin/oci (the fleet pushes them to its registry and runs them from it).
package binaries

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/mod/modfile"
)

// Set holds absolute paths of the executables.
type Set struct {
	Etcd                  string
	KubeAPIServer         string
	KubeControllerManager string
	KubeScheduler         string
	Simulator             string
	// EPP is bin/epp from `make build`, which the EPP benchmark runs as a
	// plain process; the fleet runs the picker from its image.
	EPP string
	// Images is the OCI image layout of fleetinfer's images.
	Images string
	// LWS is the LeaderWorkerSet controller; make tools puts its webhook
	// configurations (webhook.yaml) and ClusterRole (role.yaml), rendered
	// from the same module, next to it.
	LWS string
}

// tool names a pinned tool: its module under hack/tools and the module whose
// version keys its directory in bin/.
type tool struct{ dir, module string }

var (
	kube = tool{"kube", "k8s.io/kubernetes"}
	etcd = tool{"etcd", "go.etcd.io/etcd/server/v3"}
	sim  = tool{"sim", "github.com/llm-d/llm-d-inference-sim"}
	lws  = tool{"lws", "sigs.k8s.io/lws"}
)

// Locate finds the binaries from the repository root, which it looks for
// from the working directory upwards (tests run in their package directory).
// FLEETINFER_ROOT overrides the search.
func Locate() (Set, error) {
	root, err := Root()
	if err != nil {
		return Set{}, err
	}
	dir := func(t tool) (string, error) {
		v, err := version(filepath.Join(root, "hack", "tools", t.dir, "go.mod"), t.module)
		if err != nil {
			return "", err
		}
		return filepath.Join(root, "bin", t.dir+"-"+v), nil
	}
	kubeDir, err := dir(kube)
	if err != nil {
		return Set{}, err
	}
	etcdDir, err := dir(etcd)
	if err != nil {
		return Set{}, err
	}
	simDir, err := dir(sim)
	if err != nil {
		return Set{}, err
	}
	lwsDir, err := dir(lws)
	if err != nil {
		return Set{}, err
	}
	s := Set{
		Etcd:                  filepath.Join(etcdDir, "etcd"),
		KubeAPIServer:         filepath.Join(kubeDir, "kube-apiserver"),
		KubeControllerManager: filepath.Join(kubeDir, "kube-controller-manager"),
		KubeScheduler:         filepath.Join(kubeDir, "kube-scheduler"),
		Simulator:             filepath.Join(simDir, "llm-d-inference-sim"),
		LWS:                   filepath.Join(lwsDir, "lws"),
		EPP:                   filepath.Join(root, "bin", "epp"),
		Images:                filepath.Join(root, "bin", "oci"),
	}
	for _, p := range []string{s.Etcd, s.KubeAPIServer, s.KubeControllerManager, s.KubeScheduler, s.Simulator} {
		if _, err := os.Stat(p); err != nil {
			return Set{}, fmt.Errorf("%s is missing: run `make tools` first", p)
		}
	}
	return s, nil
}

const modulePath = "github.com/fleetinfer/fleetinfer"

// Root returns the repository root.
func Root() (string, error) {
	if r := os.Getenv("FLEETINFER_ROOT"); r != "" {
		return filepath.Abs(r)
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modfile.ModulePath(b) == modulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the fleetinfer repository (set FLEETINFER_ROOT)")
		}
		dir = parent
	}
}

func version(gomod, module string) (string, error) {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	f, err := modfile.ParseLax(gomod, b, nil)
	if err != nil {
		return "", err
	}
	for _, r := range f.Require {
		if r.Mod.Path == module {
			return r.Mod.Version, nil
		}
	}
	return "", fmt.Errorf("%s does not require %s", gomod, module)
}
