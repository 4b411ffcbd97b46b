package kubelet

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// A terminated pod's object is deleted even when the API server refuses
// the first attempts (it is restarting): nothing else would delete a
// terminating pod whose deletion event has passed.
func TestFinalDeleteRetriesUntilThePodIsGone(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}}
	cs := fake.NewClientset(pod)
	refusals := 2
	cs.PrependReactor("delete", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		if refusals == 0 {
			return false, nil, nil
		}
		refusals--
		return true, nil, apierrors.NewServiceUnavailable("the API server is starting")
	})
	k := &Kubelet{cs: cs, log: logr.Discard()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k.finalDelete(ctx, pod)
	if refusals != 0 {
		t.Fatalf("%d refusals left: finalDelete gave up", refusals)
	}
	if _, err := cs.CoreV1().Pods("ns").Get(ctx, "p", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the pod is still there after finalDelete: %v", err)
	}
}
