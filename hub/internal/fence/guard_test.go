package fence

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// Every kind of write through a guarded client is refused with a
// *NotHeldError while the cluster is fenced, and reaches the cluster once
// it is not; reads pass either way.
func TestGuard(t *testing.T) {
	ctx := context.Background()
	cm := func() *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"k": "v"}}
	}
	writes := []struct {
		name  string
		write func(client.Client) error
	}{
		{"create", func(c client.Client) error {
			return c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "new"}})
		}},
		{"update", func(c client.Client) error { return c.Update(ctx, cm()) }},
		{"patch", func(c client.Client) error { return c.Patch(ctx, cm(), client.MergeFrom(cm())) }},
		{"delete", func(c client.Client) error { return c.Delete(ctx, cm()) }},
		{"delete all of", func(c client.Client) error { return c.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace("ns")) }},
		{"status update", func(c client.Client) error { return c.Status().Update(ctx, cm()) }},
		{"status patch", func(c client.Client) error { return c.Status().Patch(ctx, cm(), client.MergeFrom(cm())) }},
		{"subresource update", func(c client.Client) error { return c.SubResource("status").Update(ctx, cm()) }},
	}
	held := Fence{Reason: ReasonHeldByAnotherHub, Message: "held by uid-b"}
	for _, w := range writes {
		t.Run(w.name, func(t *testing.T) {
			raw := fake.NewClientBuilder().WithObjects(cm()).WithStatusSubresource(&corev1.ConfigMap{}).Build()
			fence := held
			c := Guard(raw, "east", func() Fence { return fence })
			err := w.write(c)
			if !IsNotHeld(err) {
				t.Fatalf("fenced: %v, want a NotHeldError", err)
			}
			if got := raw.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "cm"}, &corev1.ConfigMap{}); got != nil {
				t.Fatalf("the fenced write reached the cluster: %v", got)
			}
			if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "cm"}, &corev1.ConfigMap{}); err != nil {
				t.Errorf("read while fenced: %v", err)
			}
			if err := c.List(ctx, &corev1.ConfigMapList{}); err != nil {
				t.Errorf("list while fenced: %v", err)
			}
			fence = Fence{}
			if err := w.write(c); IsNotHeld(err) {
				t.Errorf("not fenced: %v", err)
			}
		})
	}
}
