package kubelet

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// volumeDir is where a pod's volume lives on this machine.
func volumeDir(podDir, name string) string { return filepath.Join(podDir, "volumes", name) }

// syncVolumes writes the content of the pod's ConfigMap, Secret, projected and
// downward-API volumes into the pod directory (and creates the others empty),
// so that a process given a path under a mount finds the files there. It is
// called periodically: like the kubelet, a changed ConfigMap or Secret reaches
// the files, which is what certificate reloading depends on. tokenFile is the
// pod's service-account token, used for projected token sources.
func syncVolumes(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, podDir, tokenFile string) error {
	for _, v := range pod.Spec.Volumes {
		dir := volumeDir(podDir, v.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		files, err := volumeFiles(ctx, cs, pod, v, tokenFile)
		if err != nil {
			return err
		}
		for name, data := range files {
			if err := writeIfChanged(filepath.Join(dir, name), data); err != nil {
				return err
			}
		}
	}
	return nil
}

func volumeFiles(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, v corev1.Volume, tokenFile string) (map[string][]byte, error) {
	switch {
	case v.ConfigMap != nil:
		return configMapFiles(ctx, cs, pod.Namespace, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional)
	case v.Secret != nil:
		return secretFiles(ctx, cs, pod.Namespace, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional)
	case v.DownwardAPI != nil:
		return downwardFiles(pod, v.DownwardAPI.Items)
	case v.Projected != nil:
		out := map[string][]byte{}
		for _, src := range v.Projected.Sources {
			var files map[string][]byte
			var err error
			switch {
			case src.ConfigMap != nil:
				files, err = configMapFiles(ctx, cs, pod.Namespace, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional)
			case src.Secret != nil:
				files, err = secretFiles(ctx, cs, pod.Namespace, src.Secret.Name, src.Secret.Items, src.Secret.Optional)
			case src.DownwardAPI != nil:
				files, err = downwardFiles(pod, src.DownwardAPI.Items)
			case src.ServiceAccountToken != nil && tokenFile != "":
				var tok []byte
				if tok, err = os.ReadFile(tokenFile); err == nil {
					files = map[string][]byte{src.ServiceAccountToken.Path: tok}
				}
			}
			if err != nil {
				return nil, err
			}
			for k, d := range files {
				out[k] = d
			}
		}
		return out, nil
	}
	// emptyDir, PVCs, host paths and image volumes start (and stay) empty: there
	// is no storage behind them here.
	return nil, nil
}

func configMapFiles(ctx context.Context, cs kubernetes.Interface, ns, name string, items []corev1.KeyToPath, optional *bool) (map[string][]byte, error) {
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if isOptional(optional) {
			return nil, nil
		}
		return nil, configError{fmt.Errorf("configmap %q: %w", name, err)}
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return project(data, items), nil
}

func secretFiles(ctx context.Context, cs kubernetes.Interface, ns, name string, items []corev1.KeyToPath, optional *bool) (map[string][]byte, error) {
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if isOptional(optional) {
			return nil, nil
		}
		return nil, configError{fmt.Errorf("secret %q: %w", name, err)}
	}
	return project(s.Data, items), nil
}

// project applies a volume's items (key → path) or, without items, maps every
// key to a file of its own name.
func project(data map[string][]byte, items []corev1.KeyToPath) map[string][]byte {
	if len(items) == 0 {
		return data
	}
	out := map[string][]byte{}
	for _, it := range items {
		if d, ok := data[it.Key]; ok {
			out[it.Path] = d
		}
	}
	return out
}

func downwardFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, it := range items {
		if it.FieldRef == nil {
			continue
		}
		switch it.FieldRef.FieldPath {
		case "metadata.labels":
			out[it.Path] = formatMap(pod.Labels)
		case "metadata.annotations":
			out[it.Path] = formatMap(pod.Annotations)
		default:
			v, err := podField(pod, it.FieldRef.FieldPath, pod.Status.PodIP, pod.Status.HostIP)
			if err != nil {
				return nil, err
			}
			out[it.Path] = []byte(v)
		}
	}
	return out, nil
}

func formatMap(m map[string]string) []byte {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%q\n", k, m[k])
	}
	return b.Bytes()
}

// writeIfChanged replaces path atomically when its content differs, so a
// process watching the file sees one complete version at a time.
func writeIfChanged(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// mountRewriter maps paths inside the container to the pod directory.
type mountRewriter struct {
	mounts []mount // longest mount path first
}

type mount struct{ container, host string }

func newMountRewriter(c *corev1.Container, podDir string) mountRewriter {
	var r mountRewriter
	for _, m := range c.VolumeMounts {
		host := volumeDir(podDir, m.Name)
		if m.SubPath != "" {
			host = filepath.Join(host, m.SubPath)
		}
		r.mounts = append(r.mounts, mount{container: filepath.Clean(m.MountPath), host: host})
	}
	sort.Slice(r.mounts, func(i, j int) bool { return len(r.mounts[i].container) > len(r.mounts[j].container) })
	return r
}

// rewrite replaces a mounted container path in an argument ("/p", "--f=/p")
// with its host path.
func (r mountRewriter) rewrite(arg string) string {
	prefix, p := "", arg
	if i := strings.Index(arg, "="); i >= 0 && strings.HasPrefix(arg, "-") {
		prefix, p = arg[:i+1], arg[i+1:]
	}
	for _, m := range r.mounts {
		if p == m.container || strings.HasPrefix(p, m.container+"/") {
			return prefix + m.host + strings.TrimPrefix(p, m.container)
		}
	}
	return arg
}

func (r mountRewriter) rewriteAll(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = r.rewrite(a)
	}
	return out
}
