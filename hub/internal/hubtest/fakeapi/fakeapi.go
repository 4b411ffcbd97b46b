// Package fakeapi stands in for the API servers of the hub's package tests:
// a controller-runtime fake client with every API the hub uses, seen as its
// own users see it, as the hub's cache sees it and as the hub's direct
// reader sees it, with the hub's writes recorded and the faults a test
// injects. It is apart from package hubtest, whose fleet lists clusters as
// the inventory does, so that the inventory's own tests can use it.
package fakeapi

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterv1beta1 "open-cluster-management.io/api/cluster/v1beta1"
	clusterinventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// Scheme knows every API the hub reads or writes. It is built here rather
// than taken from hub.Scheme because package hub imports the packages whose
// tests use this one.
var Scheme = runtime.NewScheme()

func init() {
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha2.AddToScheme, fleetv1alpha1.AddToScheme,
		clusterv1.Install, clusterv1beta1.Install, clusterinventoryv1alpha1.AddToScheme, igwapiv1.Install, igwapixv1alpha1.Install} {
		utilruntime.Must(add(Scheme))
	}
}

// withStatus lists the custom resources whose CRDs have a status
// subresource, so that a write of the object leaves its status alone and a
// status write its spec, as on a real API server.
func withStatus() []client.Object {
	return []client.Object{&v1alpha2.LLMInferenceService{}, &v1alpha2.LLMInferenceServiceConfig{},
		&fleetv1alpha1.InferencePlacement{}, &fleetv1alpha1.ClusterCapacity{}, &fleetv1alpha1.MemberCluster{},
		&clusterv1.ManagedCluster{}, &clusterv1beta1.PlacementDecision{}, &clusterinventoryv1alpha1.ClusterProfile{},
		&igwapiv1.InferencePool{}, &igwapixv1alpha1.InferencePoolImport{}}
}

// Fault, when it returns an error, fails a call the hub makes instead of
// making it. verb is get, list, create, update, patch or delete, or
// update/<subresource> or patch/<subresource>; obj is the object or list
// of the call.
type Fault func(ctx context.Context, verb string, obj runtime.Object) error

// FailOn is a fault that fails every call of verb on objects of like's type
// (of any type when like is nil) with err.
func FailOn(verb string, like runtime.Object, err error) Fault {
	return func(_ context.Context, v string, obj runtime.Object) error {
		if v == verb && (like == nil || reflect.TypeOf(obj) == reflect.TypeOf(like)) {
			return err
		}
		return nil
	}
}

// Server is one fake API server.
type Server struct {
	// API is the server as its own users see it: a test reads and writes
	// through it what the cluster's users and controllers would, and that
	// is neither recorded nor faulted.
	API client.WithWatch
	// Client is the server as the hub under test reaches it through its
	// cache: its writes are recorded and the injected faults apply.
	Client client.WithWatch
	// Reader is the server as the hub reads it past its cache: the injected
	// faults apply.
	Reader client.Reader

	mu     sync.Mutex
	writes []string
	faults []Fault
}

// New is a server holding objs.
func New(objs ...client.Object) *Server { return build(false, objs) }

// NewSpoke is a server holding objs that the hub reaches as it reaches a
// spoke: its cache there holds only the ConfigMaps and Secrets the hub
// published (federation.SpokeCache), so Client finds no other.
func NewSpoke(objs ...client.Object) *Server { return build(true, objs) }

func build(spoke bool, objs []client.Object) *Server {
	s := &Server{API: fake.NewClientBuilder().WithScheme(Scheme).WithObjects(objs...).WithStatusSubresource(withStatus()...).Build()}
	s.Client = &view{interceptor.NewClient(s.API, s.interceptors(spoke))}
	s.Reader = &view{interceptor.NewClient(s.API, s.interceptors(false))}
	return s
}

// view is a client of the server behind a pointer, so that a test can
// compare it with another (the interceptor's client is not comparable).
type view struct{ client.WithWatch }

// Inject makes f apply to every later call the hub makes.
func (s *Server) Inject(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f)
}

// Writes is every write the hub made through Client, in order, as
// "verb Kind namespace/name".
func (s *Server) Writes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.writes)
}

// ClearWrites forgets the writes so far.
func (s *Server) ClearWrites() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes = nil
}

func (s *Server) fault(ctx context.Context, verb string, obj runtime.Object) error {
	s.mu.Lock()
	faults := slices.Clone(s.faults)
	s.mu.Unlock()
	for _, f := range faults {
		if err := f(ctx, verb, obj); err != nil {
			return err
		}
	}
	return nil
}

// write makes a write of the hub's unless a fault fails it, recording it
// first.
func (s *Server) write(ctx context.Context, verb string, obj client.Object, do func() error) error {
	if err := s.fault(ctx, verb, obj); err != nil {
		return err
	}
	kind := fmt.Sprintf("%T", obj)
	if gvk, err := apiutil.GVKForObject(obj, Scheme); err == nil {
		kind = gvk.Kind
	}
	s.mu.Lock()
	s.writes = append(s.writes, fmt.Sprintf("%s %s %s", verb, kind, client.ObjectKeyFromObject(obj)))
	s.mu.Unlock()
	return do()
}

func (s *Server) interceptors(cached bool) interceptor.Funcs {
	return interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := s.fault(ctx, "get", obj); err != nil {
				return err
			}
			if err := c.Get(ctx, key, obj, opts...); err != nil {
				return err
			}
			if cached && unpublished(obj) {
				gvk, _ := apiutil.GVKForObject(obj, Scheme)
				return apierrors.NewNotFound(corev1.Resource(gvk.Kind), key.Name)
			}
			return nil
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := s.fault(ctx, "list", list); err != nil {
				return err
			}
			if err := c.List(ctx, list, opts...); err != nil || !cached {
				return err
			}
			switch l := list.(type) {
			case *corev1.ConfigMapList:
				l.Items = slices.DeleteFunc(l.Items, func(o corev1.ConfigMap) bool { return unpublished(&o) })
			case *corev1.SecretList:
				l.Items = slices.DeleteFunc(l.Items, func(o corev1.Secret) bool { return unpublished(&o) })
			}
			return nil
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			return s.write(ctx, "create", obj, func() error { return c.Create(ctx, obj, opts...) })
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return s.write(ctx, "update", obj, func() error { return c.Update(ctx, obj, opts...) })
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			return s.write(ctx, "patch", obj, func() error { return c.Patch(ctx, obj, patch, opts...) })
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return s.write(ctx, "delete", obj, func() error { return c.Delete(ctx, obj, opts...) })
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			return s.write(ctx, "update/"+sub, obj, func() error { return c.SubResource(sub).Update(ctx, obj, opts...) })
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			return s.write(ctx, "patch/"+sub, obj, func() error { return c.SubResource(sub).Patch(ctx, obj, patch, opts...) })
		},
	}
}

// unpublished reports whether obj is a ConfigMap or Secret the hub's cache
// of a spoke does not hold.
func unpublished(obj client.Object) bool {
	switch obj.(type) {
	case *corev1.ConfigMap, *corev1.Secret:
		return !fleetv1alpha1.IsManagedByHub(obj)
	}
	return false
}
