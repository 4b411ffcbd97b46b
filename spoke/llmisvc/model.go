package llmisvc

import (
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// Where the model and its adapters appear in the model-server container.
const (
	modelMountPath   = "/mnt/models"
	loraMountPath    = "/mnt/models/lora"
	modelVolumeName  = "kserve-provision-location"
	storageInitName  = "storage-initializer"
	mainContainer    = "main"
	storageInitImage = "kserve/storage-initializer:v0.20.0"
)

// attachModel makes the model (and LoRA adapters) available at /mnt/models in
// the main container: a pvc:// model is mounted directly; hf:// and s3://
// models are fetched by KServe's storage-initializer init container into a
// shared volume, unless spec.storageInitializer.enabled is false. LoRA
// adapters also become vLLM flags, unless the container already passes
// --lora-modules.
func attachModel(pod *corev1.PodSpec, s *v1alpha2.LLMInferenceServiceSpec) {
	i := slices.IndexFunc(pod.Containers, func(c corev1.Container) bool { return c.Name == mainContainer })
	if i < 0 {
		return
	}
	main := &pod.Containers[i]
	uri := s.Model.URI
	scheme, rest, _ := strings.Cut(uri, "://")
	downloads := map[string]string{}
	switch scheme {
	case "pvc":
		claim, sub, _ := strings.Cut(rest, "/")
		addVolume(pod, corev1.Volume{Name: modelVolumeName, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: true}}})
		addMount(main, corev1.VolumeMount{Name: modelVolumeName, MountPath: modelMountPath, SubPath: sub, ReadOnly: true})
	case "hf", "s3", "gs", "https":
		downloads[uri] = modelMountPath
	}
	lora := s.Model.LoRA
	if lora != nil {
		for _, a := range lora.Adapters {
			if a.URI != "" {
				downloads[a.URI] = path.Join(loraMountPath, a.Name)
			}
		}
		addLoRAFlags(main, lora)
	}
	if len(downloads) == 0 || (s.StorageInitializer != nil && !ptr.Deref(s.StorageInitializer.Enabled, true)) {
		return
	}
	addVolume(pod, corev1.Volume{Name: modelVolumeName, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	addMount(main, corev1.VolumeMount{Name: modelVolumeName, MountPath: modelMountPath, ReadOnly: true})
	var args []string
	if u, ok := downloads[uri]; ok {
		args = append(args, uri, u)
	}
	var adapters []v1alpha2.LoRAAdapter
	if lora != nil {
		adapters = lora.Adapters
	}
	for _, a := range adapters {
		if a.URI != "" {
			args = append(args, a.URI, downloads[a.URI])
		}
	}
	init := corev1.Container{Name: storageInitName, Image: storageInitImage, Args: args,
		VolumeMounts: []corev1.VolumeMount{{Name: modelVolumeName, MountPath: modelMountPath}}}
	// Users may tune the initializer (image, env, resources); its name,
	// command and arguments are the controller's.
	if j := slices.IndexFunc(pod.InitContainers, func(c corev1.Container) bool { return c.Name == storageInitName }); j >= 0 {
		user := pod.InitContainers[j]
		if user.Image != "" {
			init.Image = user.Image
		}
		init.Env, init.Resources = user.Env, user.Resources
		init.VolumeMounts = append(init.VolumeMounts, user.VolumeMounts...)
		pod.InitContainers[j] = init
		return
	}
	pod.InitContainers = append([]corev1.Container{init}, pod.InitContainers...)
}

func addLoRAFlags(c *corev1.Container, lora *v1alpha2.LoRASpec) {
	all := strings.Join(append(append([]string{}, c.Command...), c.Args...), " ")
	if strings.Contains(all, "--lora-modules") || len(lora.Adapters) == 0 {
		return
	}
	args := []string{"--enable-lora", "--lora-modules"}
	for _, a := range lora.Adapters {
		args = append(args, a.Name+"="+path.Join(loraMountPath, a.Name))
	}
	for _, f := range []struct {
		flag string
		v    *int32
	}{{"--max-lora-rank", lora.MaxRank}, {"--max-loras", lora.MaxAdapters}, {"--max-cpu-loras", lora.MaxCpuAdapters}} {
		if f.v != nil {
			args = append(args, f.flag, strconv.Itoa(int(*f.v)))
		}
	}
	c.Args = append(c.Args, args...)
}

func addVolume(pod *corev1.PodSpec, v corev1.Volume) {
	if !slices.ContainsFunc(pod.Volumes, func(x corev1.Volume) bool { return x.Name == v.Name }) {
		pod.Volumes = append(pod.Volumes, v)
	}
}

func addMount(c *corev1.Container, m corev1.VolumeMount) {
	if !slices.ContainsFunc(c.VolumeMounts, func(x corev1.VolumeMount) bool { return x.MountPath == m.MountPath }) {
		c.VolumeMounts = append(c.VolumeMounts, m)
	}
}
