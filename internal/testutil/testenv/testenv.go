// Package testenv starts one real control plane for a package's integration
// tests, the way envtest does but with the local fleet's binaries, process
// supervision and leak check: a TestMain calls Run, tests use the returned
// Env.
package testenv

import (
	"context"
	"fmt"
	"os"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetinfer/fleetinfer/apis"
	"github.com/fleetinfer/fleetinfer/deploy/crds"
	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

// Options configures the control plane.
type Options struct {
	// CRDs to install before the tests run.
	CRDs []*apiextensionsv1.CustomResourceDefinition
	// ControllerManager also runs kube-controller-manager (garbage
	// collection, Deployments to pods, namespaces); envtest has none.
	ControllerManager bool
	// Controllers limits kube-controller-manager to these controllers
	// (its --controllers syntax); empty runs the local fleet's set.
	Controllers string
	// Scheme of Env.Client; nil is client-go's (the built-in types).
	Scheme *runtime.Scheme
}

// Env is a running control plane.
type Env struct {
	*controlplane.ControlPlane
	Config *rest.Config
	Client client.Client
}

// Run starts a control plane, runs each setup (for example a controller
// manager, stopped through its context when the tests end), runs the tests
// and stops everything, failing if any process it started is left running.
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Run(m, opts, &env)) }
func Run(m *testing.M, opts Options, env **Env, setup ...func(context.Context, *Env) error) int {
	reg := &process.Registry{}
	e, err := start(opts, reg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		reg.StopAll(controlplane.StopGrace)
		return 1
	}
	*env = e
	ctx, cancel := context.WithCancel(context.Background())
	code := 0
	for _, s := range setup {
		if err := s(ctx, e); err != nil {
			fmt.Fprintln(os.Stderr, "testenv setup:", err)
			code = 1
		}
	}
	if code == 0 {
		code = m.Run()
	}
	cancel()
	e.Stop()
	reg.StopAll(controlplane.StopGrace)
	_ = os.RemoveAll(e.Dir())
	if alive := reg.Alive(); len(alive) > 0 {
		fmt.Fprintf(os.Stderr, "testenv: processes left running: %v\n", alive)
		return 1
	}
	return code
}

// RunWithFleetCRDs is Run with fleetinfer's CRDs installed and a scheme
// of client-go's types and those added by addToScheme.
func RunWithFleetCRDs(m *testing.M, env **Env, addToScheme []func(*runtime.Scheme) error, setup ...func(context.Context, *Env) error) int {
	crds, err := apis.CRDs()
	scheme := runtime.NewScheme()
	builder := runtime.NewSchemeBuilder(append([]func(*runtime.Scheme) error{clientgoscheme.AddToScheme}, addToScheme...)...)
	if err == nil {
		err = builder.AddToScheme(scheme)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	return Run(m, Options{CRDs: crds, Scheme: scheme}, env, setup...)
}

func start(opts Options, reg *process.Registry) (*Env, error) {
	bins, err := binaries.Locate()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fleetinfer-testenv-")
	if err != nil {
		return nil, err
	}
	cp, err := controlplane.New(controlplane.Options{
		Name: "testenv", Dir: dir, Registry: reg, ControllerManager: opts.ControllerManager, Controllers: opts.Controllers,
		Binaries: controlplane.Binaries{Etcd: bins.Etcd, KubeAPIServer: bins.KubeAPIServer,
			KubeControllerManager: bins.KubeControllerManager},
	})
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	if err := cp.Start(ctx); err != nil {
		return nil, err
	}
	if err := crds.Install(ctx, cp.Admin(), opts.CRDs); err != nil {
		cp.Stop()
		return nil, err
	}
	scheme := opts.Scheme
	if scheme == nil {
		scheme = clientgoscheme.Scheme
	}
	c, err := client.New(cp.Admin(), client.Options{Scheme: scheme})
	if err != nil {
		cp.Stop()
		return nil, err
	}
	return &Env{ControlPlane: cp, Config: cp.Admin(), Client: c}, nil
}
