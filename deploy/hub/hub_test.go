// Package hub_test checks the hub manifests' cross-references that only a
// cluster with cert-manager would otherwise catch; e2e/install_*_test.go
// applies them to a real API server and runs the hub under their RBAC.
package hub_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/fleetinfer/fleetinfer/deploy/charts"
)

func objects(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := charts.ReadManifests(path)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func flag(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// The optional cert-manager CA is written to the Secret, in the namespace,
// that the hub Deployment tells the hub to sign with.
func TestCertManagerCALandsWhereTheHubReadsIt(t *testing.T) {
	var hub appsv1.Deployment
	for _, o := range objects(t, "manager.yaml") {
		if o.GetKind() == "Deployment" {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &hub); err != nil {
				t.Fatal(err)
			}
		}
	}
	args := hub.Spec.Template.Spec.Containers[0].Args
	secret, ns := flag(args, "federation-ca-secret"), flag(args, "cluster-namespace")
	if secret == "" || ns != hub.Namespace {
		t.Fatalf("hub args %v", args)
	}
	var found bool
	for _, o := range objects(t, "cert-manager/ca.yaml") {
		if o.GetKind() != "Certificate" {
			continue
		}
		found = true
		name, _, _ := unstructured.NestedString(o.Object, "spec", "secretName")
		isCA, _, _ := unstructured.NestedBool(o.Object, "spec", "isCA")
		if name != secret || o.GetNamespace() != ns || !isCA {
			t.Errorf("Certificate %s/%s writes CA=%v to %s; the hub reads %s/%s", o.GetNamespace(), o.GetName(), isCA, name, ns, secret)
		}
	}
	if !found {
		t.Error("no Certificate in cert-manager/ca.yaml")
	}
}

// Every ServiceAccount the RBAC binds is the one the Deployment runs as.
func TestRBACBindsTheHubsServiceAccount(t *testing.T) {
	var bound []string
	for _, path := range []string{"rbac/role_binding.yaml", "rbac/leader_election_role.yaml"} {
		for _, o := range objects(t, path) {
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				m := s.(map[string]any)
				bound = append(bound, m["namespace"].(string)+"/"+m["name"].(string))
			}
		}
	}
	for _, o := range objects(t, "manager.yaml") {
		if o.GetKind() != "Deployment" {
			continue
		}
		sa, _, _ := unstructured.NestedString(o.Object, "spec", "template", "spec", "serviceAccountName")
		if len(bound) != 3 || slices.ContainsFunc(bound, func(b string) bool { return b != o.GetNamespace()+"/"+sa }) {
			t.Errorf("bindings name %v, the hub runs as %s/%s", bound, o.GetNamespace(), sa)
		}
	}
}
