package testutil

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// A namespace is a valid DNS label that starts with the test's name, for
// subtests and long names too.
func TestNewNamespaceNamesAfterTheTest(t *testing.T) {
	c := fake.NewClientBuilder().Build()
	for _, sub := range []string{"plain", "With Spaces_and/slashes", strings.Repeat("long", 20)} {
		t.Run(sub, func(t *testing.T) {
			name := NewNamespace(t, c)
			if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
				t.Fatalf("%q: %v", name, errs)
			}
			if !strings.HasPrefix(name, "testnewnamespacenamesafterthetest-") {
				t.Errorf("%q does not start with the test's name", name)
			}
		})
	}
}

// Eventually returns once check succeeds, and check's context carries the
// timeout.
func TestEventuallyRetriesUntilTheCheckPasses(t *testing.T) {
	calls := 0
	Eventually(t, 5*time.Second, "third call", func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Fatal("no deadline")
		}
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Errorf("%d calls, want 3", calls)
	}
}
