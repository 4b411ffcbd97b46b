package v1alpha1_test

import (
	"os"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/internal/testutil/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithFleetCRDs(m, &env, []func(*runtime.Scheme) error{fleetv1alpha1.AddToScheme}))
}

// A label selector the hub could not parse would leave a placement without
// a decision; the API server refuses one with a message that names the
// field, whether it is the clusters' or the services' selector. An empty
// values list is what a Helm or GitOps template renders for an empty list.
func TestPlacementSelectorsThatCannotBeParsedAreRefused(t *testing.T) {
	ns := testutil.NewNamespace(t, env.Client)
	cases := []struct{ name, spec, want string }{
		{"clusters In without values", `{clusters: {selector: {matchExpressions: [{key: region, operator: In, values: []}]}}}`,
			"clusters.selector: matchExpressions[].values must not be empty for In and NotIn"},
		{"clusters NotIn without values", `{clusters: {selector: {matchExpressions: [{key: region, operator: NotIn}]}}}`,
			"clusters.selector: matchExpressions[].values must not be empty for In and NotIn"},
		{"clusters unknown operator", `{clusters: {selector: {matchExpressions: [{key: region, operator: Equals, values: [eu]}]}}}`,
			"clusters.selector: matchExpressions[].operator must be In, NotIn, Exists or DoesNotExist"},
		{"clusters Exists with values", `{clusters: {selector: {matchExpressions: [{key: region, operator: Exists, values: [eu]}]}}}`,
			"clusters.selector: matchExpressions[].values must be empty for Exists and DoesNotExist"},
		{"services In without values", `{serviceSelector: {matchExpressions: [{key: tier, operator: In, values: []}]}}`,
			"serviceSelector: matchExpressions[].values must not be empty for In and NotIn"},
		{"services unknown operator", `{serviceSelector: {matchExpressions: [{key: tier, operator: Gt, values: ["1"]}]}}`,
			"serviceSelector: matchExpressions[].operator must be In, NotIn, Exists or DoesNotExist"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := env.Client.Create(t.Context(), placement(t, ns, tc.spec))
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want Invalid, got %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("message %q lacks %q", err.Error(), tc.want)
			}
		})
	}
}

// Every selector the hub can parse is accepted.
func TestPlacementSelectorsThatParseAreAccepted(t *testing.T) {
	ns := testutil.NewNamespace(t, env.Client)
	for _, spec := range []string{
		`{clusters: {selector: {matchLabels: {region: eu}}}}`,
		`{clusters: {selector: {matchExpressions: [{key: region, operator: In, values: [eu, us]}, {key: gpu, operator: Exists}]}}}`,
		`{clusters: {selector: {matchExpressions: [{key: region, operator: NotIn, values: [ap]}, {key: spot, operator: DoesNotExist, values: []}]}}}`,
		`{serviceSelector: {matchExpressions: [{key: tier, operator: In, values: [gold]}]}}`,
		`{serviceSelector: {}, clusters: {selector: {}}}`,
	} {
		pl := placement(t, ns, spec)
		if err := env.Client.Create(t.Context(), pl); err != nil {
			t.Errorf("%s: %v", spec, err)
			continue
		}
		for _, sel := range []*metav1.LabelSelector{pl.Spec.ServiceSelector, pl.Spec.Clusters.Selector} {
			if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
				t.Errorf("%s: accepted, but the hub cannot parse it: %v", spec, err)
			}
		}
	}
}

func placement(t *testing.T, ns, spec string) *fleetv1alpha1.InferencePlacement {
	t.Helper()
	pl := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "p-"}}
	if err := yaml.Unmarshal([]byte(spec), &pl.Spec); err != nil {
		t.Fatal(err)
	}
	return pl
}
