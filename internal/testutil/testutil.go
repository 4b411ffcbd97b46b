// Package testutil holds the helpers that tests of several packages share:
// waiting for a condition and a namespace of one's own. Tests against a real
// control plane start it with the testenv package below this one.
package testutil

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Eventually calls check every 100 ms until it returns nil, and fails the
// test with what and check's last error when timeout passes first. check's
// context ends at the timeout. It does not derive from t.Context, so it can
// also wait inside a t.Cleanup.
func Eventually(t testing.TB, timeout time.Duration, what string, check func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for {
		if last = check(ctx); last == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not true after %s: %v", what, timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// NewNamespace creates a namespace for the test through c and returns its
// name: the test's name made a valid DNS label and cut to 50 characters,
// then a random suffix from the API server. The namespace stays when the
// test ends; callers whose tests share a cluster delete it themselves.
func NewNamespace(t testing.TB, c client.Client) string {
	t.Helper()
	return NewLabelledNamespace(t, c, nil)
}

// NewLabelledNamespace is NewNamespace with labels from its creation on:
// admission policies read namespaces' labels from an informer, which a
// later update reaches only after a while.
func NewLabelledNamespace(t testing.TB, c client.Client, labels map[string]string) string {
	t.Helper()
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	if name = strings.Trim(name, "-"); name == "" {
		name = "test"
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-", Labels: labels}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}
