package kubelet

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// configError is a container configuration the kubelet cannot satisfy yet (a
// missing ConfigMap or Secret); like the real kubelet it is reported as
// CreateContainerConfigError and retried.
type configError struct{ error }

// containerEnv resolves a container's environment the way the kubelet does:
// envFrom first, then env in order, with $(VAR) references to earlier values.
func containerEnv(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, c *corev1.Container, podIP, hostIP string) ([]string, map[string]string, error) {
	vals := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, src := range c.EnvFrom {
		data, err := envSource(ctx, cs, pod.Namespace, src)
		if err != nil {
			return nil, nil, err
		}
		for k, v := range data {
			set(src.Prefix+k, v)
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expand(e.Value, vals))
			continue
		}
		v, err := envValueFrom(ctx, cs, pod, c, e.ValueFrom, podIP, hostIP)
		if err != nil {
			return nil, nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		set(e.Name, v)
	}
	env := make([]string, 0, len(order))
	for _, k := range order {
		env = append(env, k+"="+vals[k])
	}
	return env, vals, nil
}

func envSource(ctx context.Context, cs kubernetes.Interface, ns string, src corev1.EnvFromSource) (map[string]string, error) {
	switch {
	case src.ConfigMapRef != nil:
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, src.ConfigMapRef.Name, metav1.GetOptions{})
		if err != nil {
			if isOptional(src.ConfigMapRef.Optional) {
				return nil, nil
			}
			return nil, configError{fmt.Errorf("configmap %q: %w", src.ConfigMapRef.Name, err)}
		}
		return cm.Data, nil
	case src.SecretRef != nil:
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, src.SecretRef.Name, metav1.GetOptions{})
		if err != nil {
			if isOptional(src.SecretRef.Optional) {
				return nil, nil
			}
			return nil, configError{fmt.Errorf("secret %q: %w", src.SecretRef.Name, err)}
		}
		out := make(map[string]string, len(s.Data))
		for k, v := range s.Data {
			out[k] = string(v)
		}
		return out, nil
	}
	return nil, nil
}

func isOptional(o *bool) bool { return o != nil && *o }

func envValueFrom(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, c *corev1.Container, src *corev1.EnvVarSource, podIP, hostIP string) (string, error) {
	switch {
	case src.FieldRef != nil:
		return podField(pod, src.FieldRef.FieldPath, podIP, hostIP)
	case src.ResourceFieldRef != nil:
		return resourceField(c, src.ResourceFieldRef)
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, err := cs.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err == nil {
			if v, ok := cm.Data[ref.Key]; ok {
				return v, nil
			}
			err = fmt.Errorf("key %q not found", ref.Key)
		}
		if isOptional(ref.Optional) {
			return "", nil
		}
		return "", configError{fmt.Errorf("configmap %q: %w", ref.Name, err)}
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s, err := cs.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err == nil {
			if v, ok := s.Data[ref.Key]; ok {
				return string(v), nil
			}
			err = fmt.Errorf("key %q not found", ref.Key)
		}
		if isOptional(ref.Optional) {
			return "", nil
		}
		return "", configError{fmt.Errorf("secret %q: %w", ref.Name, err)}
	}
	return "", nil
}

var labelRef = regexp.MustCompile(`^metadata\.(labels|annotations)\['(.+)'\]$`)

func podField(pod *corev1.Pod, path, podIP, hostIP string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return podIP, nil
	case "status.hostIP", "status.hostIPs":
		return hostIP, nil
	}
	if m := labelRef.FindStringSubmatch(path); m != nil {
		if m[1] == "labels" {
			return pod.Labels[m[2]], nil
		}
		return pod.Annotations[m[2]], nil
	}
	return "", fmt.Errorf("unsupported fieldRef %q", path)
}

func resourceField(c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		return "", fmt.Errorf("unsupported resourceFieldRef %q", ref.Resource)
	}
	list := c.Resources.Limits
	if kind == "requests" {
		list = c.Resources.Requests
	}
	q := list[corev1.ResourceName(name)]
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	// Round up, as the kubelet does, so that a fractional CPU becomes 1.
	v := (q.MilliValue() + divisor.MilliValue() - 1) / divisor.MilliValue()
	return fmt.Sprint(v), nil
}

var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)

// expand replaces $(VAR) with its value; unknown references stay as they are
// and $$ escapes a dollar, following the API's rules for command and args.
func expand(s string, vals map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := vals[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

func expandAll(in []string, vals map[string]string) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = expand(s, vals)
	}
	return out
}
