package kubelet

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// A Runtime turns a container of a known image into a process on this machine:
// fleetinfer's images are pulled from the fleet's registry and run from their
// unpacked filesystem (ImageRuntime); images of model servers that do not
// exist here map to a local binary (vLLM-compatible servers to
// llm-d-inference-sim).
type Runtime interface {
	// Name describes the runtime in events and logs.
	Name() string
	// Matches reports whether the runtime runs this image.
	Matches(image string) bool
	// Prepare returns how to run the container. Command and args have had
	// $(VAR) references expanded and volume paths rewritten to the host.
	Prepare(ctx context.Context, c *Container) (*Launch, error)
}

// Container is what a runtime sees of the container it prepares.
type Container struct {
	Pod  *corev1.Pod
	Spec *corev1.Container
	// Command and Args are the container's, expanded.
	Command, Args []string
	// Env is the container's environment as NAME=value.
	Env []string
	// PodIP is the address the pod's ports must answer on.
	PodIP string
	// FreePort reserves a free local port for the process to listen on.
	FreePort func() (int, error)
}

// Launch is a prepared process.
type Launch struct {
	Path string
	Args []string
	Env  []string
	// Ports maps a port of the pod (podIP:port) to the local port the process
	// listens on. The kubelet forwards the first to the second because most
	// binaries here cannot bind one address of their choosing.
	Ports map[int32]int
	// Dir is the process's working directory; empty: the pod's directory.
	Dir string
	// ImageID is the image the process runs from, as a container status'
	// imageID reports it; empty for a runtime that maps an image to a
	// binary.
	ImageID string
	// User is the image's user. The process runs as the kubelet's user
	// (see ImageRuntime); the user is reported in the Started event.
	User string
	// Completed marks a container with nothing to run (a model download into
	// a volume that does not exist here): it counts as having exited 0.
	Completed bool
}

// Runtimes is an ordered set of runtimes; the first match wins.
type Runtimes []Runtime

// For returns the runtime of image or an error naming what is supported.
func (rs Runtimes) For(image string) (Runtime, error) {
	for _, r := range rs {
		if r.Matches(image) {
			return r, nil
		}
	}
	names := make([]string, 0, len(rs))
	for _, r := range rs {
		names = append(names, r.Name())
	}
	return nil, fmt.Errorf("the local kubelet has no runtime for image %q (it runs: %s)", image, strings.Join(names, "; "))
}

// imageRepository strips the registry-independent tag or digest from image.
func imageRepository(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}
	// A colon after the last slash starts a tag; one before it is a registry port.
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return image
}

// CompletedRuntime runs images whose work has no meaning without real storage
// (KServe's storage initializer downloads model weights; there are none).
type CompletedRuntime struct {
	Description string
	Repos       []string
}

func (r CompletedRuntime) Name() string { return r.Description }

func (r CompletedRuntime) Matches(image string) bool { return matchesAny(image, r.Repos) }

func (r CompletedRuntime) Prepare(context.Context, *Container) (*Launch, error) {
	return &Launch{Completed: true}, nil
}

// matchesAny reports whether the image's repository contains any of the given
// fragments, so that a mirror registry or another tag still matches.
func matchesAny(image string, fragments []string) bool {
	repo := imageRepository(image)
	for _, f := range fragments {
		if strings.Contains(repo, f) {
			return true
		}
	}
	return false
}
