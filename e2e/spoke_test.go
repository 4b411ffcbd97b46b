package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

const cpuSample = "../apis/serving/v1alpha2/testdata/kserve-v0.20.0/samples/opt-125m-cpu__llm-inference-service-facebook-opt-125m-cpu.0.yaml"

// KServe's CPU sample (opt-125m with scheduler, route and gateway), applied
// unchanged to a spoke, becomes Ready: simulator pods serve it, the endpoint
// picker runs as a pod under its own service account, and a completion sent
// to the service's URL goes through the gateway, the picker and a model
// server.
func TestKServeCPUSampleBecomesReadyAndServesThroughTheGateway(t *testing.T) {
	serveKServeCPUSample(t, fl.Spokes[0])
}

// serveKServeCPUSample applies KServe's CPU sample to a new namespace of the
// spoke, waits for it to be Ready through whichever spoke controller runs
// there, sends a completion through the gateway, and returns the service's
// endpoint picker pod.
func serveKServeCPUSample(t *testing.T, spoke *fleet.Cluster) corev1.Pod {
	t.Helper()
	ns := namespace(t, spoke)
	ctx := context.Background()
	name := applySample(t, spoke, cpuSample, ns)
	svc := serviceReady(t, spoke, ns, name, 90*time.Second)

	workload := readyPod(t, spoke, ns, map[string]string{"app.kubernetes.io/name": name, "kserve.io/component": "workload"})
	if !strings.HasPrefix(workload.Status.PodIP, "127.") {
		t.Errorf("model server pod IP %q", workload.Status.PodIP)
	}
	epp := readyPod(t, spoke, ns, map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/component": "llminferenceservice-router-scheduler"})
	if epp.Spec.ServiceAccountName != name+"-epp-sa" {
		t.Errorf("endpoint picker runs as %q", epp.Spec.ServiceAccountName)
	}

	url := ""
	if svc.Status.URL != nil {
		url = *svc.Status.URL
	}
	if !strings.HasPrefix(url, "http://127.") || !strings.HasSuffix(url, "/"+ns+"/"+name) {
		t.Fatalf("status.url %q is not the gateway's path for the service", url)
	}
	complete(t, url, `{"model":"facebook/opt-125m","prompt":"The local fleet says","max_tokens":6}`)
	var pods corev1.PodList
	if err := spoke.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount > 0 {
				t.Errorf("pod %s container %s restarted %d times", p.Name, cs.Name, cs.RestartCount)
			}
		}
	}
	return epp
}
