package federation

import (
	"bytes"
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// ensureCertificate keeps m's picker certificate and trust bundle current
// and returns when to look again (zero: only when something changes).
func (r *Reconciler) ensureCertificate(ctx context.Context, svc *v1alpha2.LLMInferenceService, m member) (time.Time, error) {
	id := r.identity(m.cluster.Name, svc)
	name := fleetv1alpha1.FederationTLSName(svc.Name)
	cur := &corev1.Secret{}
	err := m.cluster.Client.Get(ctx, client.ObjectKey{Namespace: svc.Namespace, Name: name}, cur)
	if err != nil && !apierrors.IsNotFound(err) {
		return time.Time{}, err
	}
	if err == nil && !fleetv1alpha1.IsOwnedByHub(cur, r.Opts.HubID) {
		r.notOurs(svc, m, cur)
		return time.Time{}, nil
	}
	if err == nil {
		v, err := r.CA.Check(ctx, id, cur.Data[corev1.TLSCertKey])
		if err != nil {
			return time.Time{}, err
		}
		if v.KeepLeaf {
			if bytes.Equal(cur.Data[corev1.ServiceAccountRootCAKey], v.Bundle) {
				return v.Recheck, nil
			}
			// A rotation changed the trust bundle only: the picker keeps its
			// certificate, so its open streams stay up.
			changed, err := r.publishCertificate(ctx, svc, m, name, cur.Data[corev1.TLSCertKey], cur.Data[corev1.TLSPrivateKeyKey], v.Bundle)
			if changed {
				r.Recorder.Eventf(svc, corev1.EventTypeNormal, ReasonTrustUpdated, "Updated the federation trust bundle of the endpoint picker in cluster %s to %d CAs",
					m.cluster.Name, bytes.Count(v.Bundle, []byte("BEGIN CERTIFICATE")))
			}
			return v.Recheck, err
		}
	}
	cert, err := r.CA.Issue(ctx, id)
	if err != nil {
		return time.Time{}, err
	}
	changed, err := r.publishCertificate(ctx, svc, m, name, cert.Cert, cert.Key, cert.Bundle)
	if changed {
		r.Recorder.Eventf(svc, corev1.EventTypeNormal, ReasonCertificateIssued, "Issued the federation certificate of the endpoint picker in cluster %s for %s", m.cluster.Name, id)
	}
	return cert.Recheck, err
}

// publishCertificate writes a picker's certificate Secret and reports
// whether it changed.
func (r *Reconciler) publishCertificate(ctx context.Context, svc *v1alpha2.LLMInferenceService, m member, name string, cert, key, bundle []byte) (bool, error) {
	want := &corev1.Secret{
		ObjectMeta: r.childMeta(svc, m, name),
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key,
			corev1.ServiceAccountRootCAKey: bundle},
	}
	changed, err := apply(ctx, r, svc, m, want, func(cur *corev1.Secret) bool {
		cur.Data, cur.Type = want.Data, want.Type
		return true
	})
	return changed && err == nil, err
}
