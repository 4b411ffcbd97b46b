package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// applySample creates the KServe sample at path in namespace ns of the
// spoke, unchanged but for its namespace, and returns its name.
func applySample(t *testing.T, spoke *fleet.Cluster, path, ns string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(b, &obj.Object); err != nil {
		t.Fatal(err)
	}
	obj.SetNamespace(ns)
	if err := spoke.Client.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
	return obj.GetName()
}

// serviceReady waits until the service is Ready=True and returns it; while
// it is not, its conditions say why.
func serviceReady(t *testing.T, spoke *fleet.Cluster, ns, name string, timeout time.Duration) *v1alpha2.LLMInferenceService {
	t.Helper()
	svc := &v1alpha2.LLMInferenceService{}
	testutil.Eventually(t, timeout, "Ready", func(ctx context.Context) error {
		if err := spoke.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
			return err
		}
		if !svc.Status.IsTrue(v1alpha2.Ready) {
			var parts []string
			for _, c := range svc.Status.Conditions {
				parts = append(parts, fmt.Sprintf("%s=%s %s", c.Type, c.Status, c.Message))
			}
			return fmt.Errorf("not ready: %s", strings.Join(parts, "; "))
		}
		return nil
	})
	return svc
}

// complete posts an OpenAI completion request to url and fails the test
// unless choices come back; it returns the response's headers.
func complete(t *testing.T, url, body string) http.Header {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var completion struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(out, &completion) != nil || len(completion.Choices) == 0 {
		t.Fatalf("completion from %s: %s %s", url, resp.Status, out)
	}
	return resp.Header
}
