package fleet

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/fleetinfer/fleetinfer/e2e/controlplane"
	"github.com/fleetinfer/fleetinfer/e2e/process"
)

// startSpokeController runs bin/spoke against the spoke as a separate
// process, as it runs in a real cluster, and waits until it reports ready.
// It uses the admin identity; the Helm chart's RBAC is proven separately.
func (f *Fleet) startSpokeController(ctx context.Context, s *Cluster) error {
	bin := f.opts.Binaries.Spoke
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%s is missing: run `make build` first", bin)
	}
	ports, err := controlplane.FreePorts(2)
	if err != nil {
		return err
	}
	probe := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	p, err := process.Start(process.Spec{
		Name: s.Name() + "/spoke-controller",
		Path: bin,
		Args: []string{
			"--kubeconfig=" + s.AdminKubeconfig(),
			"--metrics-bind-address=" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
			"--health-probe-bind-address=" + probe,
			"--system-namespace=" + Namespace,
			"--default-gateway=" + Namespace + "/" + GatewayName,
		},
		LogPath: filepath.Join(s.Dir(), "logs", "spoke-controller.log"),
	}, f.Registry)
	if err != nil {
		return err
	}
	s.ControllerMetrics = "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])) + "/metrics"
	return controlplane.WaitHTTP(ctx, p, http.DefaultClient, "http://"+probe+"/readyz", time.Minute)
}
